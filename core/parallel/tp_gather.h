#pragma once
// The capture points of a tensor-parallel run, assembled from its ranks' traces into the tensors
// a TP = 1 run (and the reference) has, so that dumps keep the golden schema and compare, bisect
// and report read them unchanged. By point (the rank's shard shapes: tp_rank_config):
//   attn.qkv             [q_r | k_r | v_r] per rank -> [q_0 .. q_tp-1 | k | v]
//   attn.q_norm, rope_q, core, mlp.act        columns concatenated in rank order
//   attn.k_norm, rope_k, k_cache, v_cache     the KV heads' columns, each head once (ranks that
//                        replicate a head when tp > num_kv_heads give it once)
//   mlp.gate_up          [gate_r | up_r] per rank -> [gate | up]
//   <row-parallel linear>.x_scales / .x_values (attn.o_proj, mlp.down_proj, moe.experts.w2):
//                        the rank quantized its own slice of the input columns. Scales of
//                        column groups concatenate with their codes; one scale per row that all
//                        ranks share (a static scale) is that scale; one per row that differs
//                        across ranks (a dynamic per-token scale over the rank's slice) has no
//                        TP = 1 counterpart: both points are then absent, with the reason. (A
//                        rank holding exactly one column group reads as one scale per row.)
//   moe.expert_out       absent: each rank's are partial sums over its slice of the experts'
//                        intermediate size, completed only after the combine's all-reduce.
//   every other point    replicated (after an all-reduce, or computed from replicated inputs):
//                        rank 0's, after checking that every rank holds the same bits (an Error
//                        naming the point and the rank otherwise: the ranks diverged).
#include <string>
#include <vector>

#include "core/capture/trace.h"
#include "core/config/model_config.h"

namespace qparity {

struct AbsentTpPoint {
  std::string name;
  std::string reason;
};

struct GatheredTrace {
  Trace trace;  // the whole-model points, in rank 0's recording order
  std::vector<AbsentTpPoint> absent;
};

// ranks[r]: rank r's trace of the same forward(s); cfg: the whole model's config. Throws naming
// the point when a rank lacks it or its shape is not the rank's shard shape.
GatheredTrace gather_tp_trace(const std::vector<const Trace*>& ranks, const ModelConfig& cfg);

// Rank r's part of a whole point, by the rules above (the inverse of the gather, for the tests
// and for the engine's layer inputs); throws for a point with no split rule
// (x_scales of row-parallel linears, moe.expert_out).
Matrix split_tp_point(const std::string& name, const Matrix& whole, const ModelConfig& cfg,
                      int rank, int tp);

}  // namespace qparity
