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
// Weights stay in their checkpoint dtype (the embedding is read from the memory map in place);
// once a method holds its copy, the tensor's mapped pages are given back to the kernel, so a
// loaded model's resident memory is its weights once, not twice.
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

namespace qparity::reference {

// One engine linear layer: what the loader builds one LinearMethod for. The geometry (which
// checkpoint modules fuse into which layer, with which partitions) lives here only, so that
// checks made before loading (fixtures::scheme_exclusions) see the layers the loader builds.
enum class LinearLayerKind : uint8_t {
  kQkv,  // q/k/v_proj fused (partitions 0/1/2)
  kOProj,
  kGateUp,      // dense MLP gate/up_proj fused
  kDown,        // dense MLP down_proj
  kRouter,      // MoE mlp.gate
  kExpertsW13,  // expert stack, gate/up of every expert
  kExpertsW2,   // expert stack, down of every expert
  kLmHead,
  // Qwen3.5 Gated DeltaNet: in_proj_qkv | in_proj_z, in_proj_b | in_proj_a (fused as vLLM's
  // in_proj_qkvz / in_proj_ba, partitions in that order), out_proj.
  kLinearAttnQkvz,
  kLinearAttnBa,
  kLinearAttnOut,
};

struct LinearLayer {
  // A checkpoint module the layer holds, "model.layers.0.self_attn.k_proj" -> partition 1.
  struct Member {
    std::string module;
    int64_t partition = 0;
    int64_t expert = 0;
  };
  LinearLayerKind kind = LinearLayerKind::kOProj;
  int64_t layer = -1;  // decoder layer; -1 for lm_head
  LinearShape shape;
  std::vector<Member> members;
  // The plan entry whose scheme the layer runs: its first member, or the expert stack.
  std::string plan_entry;
  // The name of an already fused checkpoint module ("<prefix>.qkv_proj"), or empty.
  std::string fused_module;
};

// Every linear layer of `cfg`, in build order: per decoder layer qkv, o_proj (or a Gated
// DeltaNet layer's qkvz, ba, out_proj), then gate_up and down (dense MLP) or router, experts w13
// and w2 (MoE layer); lm_head last.
std::vector<LinearLayer> linear_layers(const ModelConfig& cfg, DType model_dtype,
                                       std::optional<DType> run_dtype = std::nullopt);

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
