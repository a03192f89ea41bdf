#pragma once
// Checkpoint directory -> CausalLm, structure first, weights second:
//   1. config.json -> ModelConfig -> the architecture's blocks; the QuantPlan (build_quant_plan:
//      --scheme override, msModelSlim description, quantization_config, or none) picks a
//      LinearMethod for every engine layer: fused q/k/v (the three plan entries must agree, as
//      vLLM requires), fused gate/up, o_proj, down_proj, the MoE router, the expert stacks
//      (w13 = gate/up, w2 = down), lm_head; and a KvCacheMethod per attention layer.
//   2. Every checkpoint tensor is routed by name to exactly one consumer: a linear shard
//      (q_proj -> partition 0 of qkv, ...; experts.<e>.* -> expert e of a stack), an already
//      fused tensor (qkv_proj / gate_up_proj, split by rows into the partitions), a KV-cache
//      parameter, a norm (weight, anti-outlier bias, or the old module.weight / module.bias with
//      the plain weight as fallback), the embedding. A tensor nothing consumes, a tensor given
//      twice, a wrong shape or dtype, and (at process time) a missing tensor are Errors naming
//      the checkpoint tensor.
//   3. process_weights_after_loading on every method.
// Weights stay in their checkpoint dtype (the embedding is read from the memory map in place).
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "reference_cpu/models/causal_lm.h"

namespace qparity::reference {

struct LoadOptions {
  std::optional<std::string> override_scheme;  // --scheme
  Dialect dialect = Dialect::kIdeal;
  PrecisionMode mode = PrecisionMode::kExact;
};

std::unique_ptr<CausalLm> load_model(const std::filesystem::path& checkpoint_dir,
                                     const LoadOptions& options = {});

// The same from parts already in hand (tests, tools that build the plan themselves).
std::unique_ptr<CausalLm> load_model(std::shared_ptr<const Checkpoint> checkpoint, ModelConfig cfg,
                                     QuantPlan plan, Dialect dialect, PrecisionMode mode);

}  // namespace qparity::reference
