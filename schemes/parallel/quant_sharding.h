#pragma once
// Tensor-parallel sharding of a quantized linear's checkpoint tensors: what rank r of tp holds of
// each tensor the scheme stores beside (or instead of) `.weight`, given the weight's own shard
// (tp_sharding.h: column-parallel rows, row-parallel input columns, KV heads split or replicated).
// Each tensor's axes come from the scheme registry's shape for it
// (schemes/description/scheme_registry.h, the table `qparity schemes` prints), read relative to the
// logical weight [N, K]:
//   [N, K/c] / [N, K]  codes (c per word or byte when packed), group scales and offsets: rows
//                      with a column-parallel weight; blocks of c input columns with a row-parallel
//                      one. A group or packed word that straddles a rank's boundary is an Error
//                      naming the tensor, as vLLM and SGLang refuse such a partition.
//   [ceil(N/B), ceil(K/B)]  fp8 128 x 128 block scales: with their blocks, a rank boundary inside
//                      a block an Error (vLLM's validate_fp8_block_shape); the ragged last block of
//                      the whole tensor is allowed.
//   [N], [N, 1]        per-channel scales, offsets, deq_scale, bias: rows with a column-parallel
//                      weight; whole on every rank of a row-parallel one (they scale each rank's
//                      partial sum, which is linear), except the terms added once to the output,
//                      msModelSlim's quant_bias and a bias, which rank 0 alone holds (the others
//                      zeros of the same shape) so the all-reduce adds them once.
//   [Hkv*D]            msModelSlim C8 KV-cache scales / offsets on k_proj / v_proj: with the
//                      projection's rows, so with its KV heads (replicated when tp > num_kv_heads).
//   [1], [2], [K]      per-tensor scales (fp8-tensor, NVFP4's global scales, static input scales),
//                      weight_shape, g_idx: whole on every rank (g_idx sliced with the columns of
//                      a row-parallel weight). weight_shape keeps the checkpoint's [N, K]: a
//                      loader takes the shard's shape from the weight's shard, not from it.
// Fused partitions (qkv, gate/up, w13): each rank unifies the same per-tensor scalars as TP = 1
// does (fp8-tensor's max over q/k/v or gate/up, NVFP4's global-scale reconciliation), because
// every rank holds those scalars whole; so the unified scale of a rank equals TP = 1's, as in vLLM,
// whose process_weights_after_loading runs per rank over the same scalars.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "schemes/description/scheme_registry.h"

namespace qparity {

enum class QuantShardKind {
  kWhole,  // every rank holds the tensor as stored
  kSlice,  // [begin, end) along dim
  kZeros,  // zeros of the stored shape (a term added once, held whole by rank 0 alone)
};

struct QuantTensorShard {
  QuantShardKind kind = QuantShardKind::kWhole;
  int dim = 0;
  int64_t begin = 0, end = 0;
};

// The shard of `<linear>.<tensor>` (its stored shape `shape`) of a linear of scheme `scheme` with
// the logical weight [n, k], held by `rank` of `tp`. `tensor` is the registry's relative name
// (weight_scale, quant_bias, k_proj.kv_cache_scale, ...). Errors name the tensor and the rule.
// act_order: the layer stores weight_g_idx (compressed-tensors actorder "group"): its groups are
// not contiguous columns, so on a row-parallel layer the group scales and offsets stay whole on
// every rank and only g_idx is sliced (vLLM's marlin_repeat_scales_on_all_ranks).
QuantTensorShard quant_tensor_shard(const ModelConfig& cfg, const SchemeId& scheme,
                                    const std::string& linear, const std::string& tensor,
                                    const std::vector<uint64_t>& shape, int64_t n, int64_t k,
                                    int rank, int tp, bool act_order = false);

}  // namespace qparity
