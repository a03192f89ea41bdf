#pragma once
// Checkpoint tensors -> processed layer weights (layer_weights.h), for both engines. The reference
// holds every layer (or streams them: reference_cpu/models/model_loader.h); the GPU engine loads
// one layer at a time, uploads it and frees it (gpu_engine/planned_model_loader.cpp), so its host
// memory is one layer's weights beyond the memory map.
//   1. Structure: the architecture's blocks (architectures/), the linear layers of the config
//      (linear_layers.h), and a LinearMethod per linear layer chosen by the QuantPlan: fused
//      q/k/v (the three plan entries must agree, as vLLM requires), fused gate/up, o_proj,
//      down_proj, the MoE router, the expert stacks (w13 = gate/up, w2 = down), lm_head; and a
//      KvCacheMethod per attention layer.
//   2. Every checkpoint tensor is routed by name to exactly one consumer: a linear shard
//      (q_proj -> partition 0 of qkv, ...; experts.<e>.* -> expert e of a stack), an already
//      fused tensor (qkv_proj / gate_up_proj, split by rows into the partitions), a KV-cache
//      parameter, a norm (weight, anti-outlier bias, or the old module.weight / module.bias with
//      the plain weight as fallback), the embedding. A tensor nothing consumes, a tensor given
//      twice, a wrong shape or dtype, and (at process time) a missing tensor are Errors naming
//      the checkpoint tensor.
//   3. process_weights_after_loading on every method.
// Weights stay in their checkpoint dtype (the embedding is read from the memory map in place);
// once a method holds its copy, the tensor's mapped pages are given back to the kernel, so loaded
// weights are resident once, not twice.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "schemes/description/quant_plan.h"
#include "schemes/loading/layer_weights.h"
#include "schemes/loading/linear_layers.h"
#include "schemes/loading/online_transform_matrices.h"

namespace qparity::reference {

// What every method the loader builds is made under. cfg and plan must outlive the loader.
struct WeightContext {
  const ModelConfig* cfg = nullptr;
  const QuantPlan* plan = nullptr;
  Dialect dialect = Dialect::kIdeal;
  DType model_dtype = DType::kBF16;  // model_dtype_of(cfg): the shapes' model dtype
  // A run dtype asked for (an fp32 checkpoint on a bf16 engine): unquantized weights, norms and
  // Gated DeltaNet parameters are rounded to it once at load. Empty: nothing rounded.
  std::optional<DType> weight_rounding;
  // The matrices of the plan's online transforms (OnlineTransformMatrices::read, once per
  // checkpoint); their tensors are consumed there. Null: a plan with online transforms is
  // refused when its first such layer is built.
  std::shared_ptr<const OnlineTransformMatrices> transforms;
};

class WeightLoader {
 public:
  // dry: load() only checks that every tensor has a consumer, loading nothing (the up-front check
  // of a loader that builds layers later).
  WeightLoader(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
               const std::vector<LinearLayer>& linears, bool dry = false);
  ~WeightLoader();
  WeightLoader(const WeightLoader&) = delete;
  WeightLoader& operator=(const WeightLoader&) = delete;

  // Decoder layer `layer` (its index set): attention, norms, MLP or MoE, their methods, registered
  // for routing. The layer must stay where it is until load() returns.
  void build_layer(LayerWeights& layer);
  // The final norm and lm_head, and the embedding routed by name.
  void build_top(TopWeights& top);
  // Routes the named checkpoint tensors (each must have a consumer built here), resolves the
  // norms and processes every method built here; the routed tensors' mapped pages are then
  // returned to the kernel.
  void load(const std::vector<std::string>& names);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// A checkpoint's tensor names by decoder layer ("model.layers.<i>.…", i < num_layers) and the
// rest (embedding, final norm, lm_head, and names a top-level routing refuses).
struct TensorsByLayer {
  std::vector<std::string> top;
  std::vector<std::vector<std::string>> layers;
};
TensorsByLayer tensors_by_layer(const Checkpoint& ckpt, int64_t num_layers);

// Every decoder layer's tensors routed dry: an unexpected tensor is an Error before anything is
// loaded (a wrong shape or dtype inside a layer shows when that layer loads).
void check_every_layer_tensor_used(std::shared_ptr<const Checkpoint> ckpt, WeightContext ctx,
                                   const std::vector<LinearLayer>& linears,
                                   const TensorsByLayer& names);

}  // namespace qparity::reference
