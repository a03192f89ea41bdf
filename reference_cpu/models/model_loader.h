#pragma once
// Checkpoint directory -> CausalLm: config.json -> ModelConfig, the QuantPlan (build_quant_plan:
// --scheme override, msModelSlim description, quantization_config, or none), and the weights
// through the schemes room's loader (schemes/loading/weight_loader.h states its rules: every
// tensor routed to one consumer, every shape and dtype checked, every method processed).
// Streaming (LoadOptions::streaming): the embedding, final norm and lm_head load at once; every
// decoder layer's tensors are routed dry at load (an unexpected tensor fails before any compute)
// and loaded, processed and freed layer by layer as the model runs; a wrong shape or dtype, or a
// missing tensor, inside a layer is reported when that layer first loads.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reference_cpu/models/causal_lm.h"
#include "schemes/loading/linear_layers.h"

namespace qparity::reference {

// Whether the model is held whole or streamed one decoder layer at a time (CausalLm's
// stream_layers_from): kAuto streams when the checkpoint's tensors exceed the memory budget.
enum class LayerStreaming : uint8_t { kNever, kAuto, kAlways };

struct LoadOptions {
  std::optional<std::string> override_scheme;  // --scheme
  Dialect dialect = Dialect::kIdeal;
  PrecisionMode mode = PrecisionMode::kExact;
  std::optional<DType> run_dtype;  // CausalLm's: the dtype an engine runs the weights in
  LayerStreaming streaming = LayerStreaming::kNever;
  uint64_t memory_budget = 0;  // bytes, for kAuto; 0: the machine's available memory
};

// The bytes of every tensor in the checkpoint (what a whole model holds once loaded, roughly:
// processing may add run-time layouts).
uint64_t checkpoint_bytes(const Checkpoint& ckpt);
// Whether load_model streams a checkpoint of `tensor_bytes` under these options.
bool streams_under(const LoadOptions& options, uint64_t tensor_bytes);

std::unique_ptr<CausalLm> load_model(const std::filesystem::path& checkpoint_dir,
                                     const LoadOptions& options = {});

// The same from parts already in hand (tests, tools that build the plan themselves).
std::unique_ptr<CausalLm> load_model(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig cfg,
                                     QuantPlan plan, Dialect dialect, PrecisionMode mode,
                                     std::optional<DType> run_dtype = std::nullopt);

}  // namespace qparity::reference
