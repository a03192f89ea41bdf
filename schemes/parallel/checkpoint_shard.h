#pragma once
// One tensor-parallel rank's view of a checkpoint: every tensor sliced by the rules of
// tp_sharding.h (weights, embedding, norms) and quant_sharding.h (what a quantized linear stores
// beside its weight), held in memory as a checkpoint of the same tensor names whose shapes are
// tp_rank_config(cfg, tp)'s. A loader that reads a whole checkpoint then loads a rank's part
// unchanged: the rank's quantized layers are processed from the rank's tensors, as vLLM's
// process_weights_after_loading runs per rank. Rewritten, not sliced: compressed-tensors'
// weight_shape holds the shard's [N, K]; a row-parallel layer's terms added once to the output
// (msModelSlim quant_bias) are zeros on every rank but 0.
#include <cstdint>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

// rank's shard of `full` for tp ranks; `plan` is the quantization plan of the whole model
// (built from cfg and the checkpoint's descriptions). Errors name the tensor and the rule that
// fails (a size that does not divide, a group or block straddling a rank's boundary, a tensor
// with no rule, an act-order checkpoint). The shard's root is full.root() / "tp<rank>of<tp>".
Checkpoint shard_checkpoint(const Checkpoint& full, const ModelConfig& cfg, const QuantPlan& plan,
                            int rank, int tp);

}  // namespace qparity
