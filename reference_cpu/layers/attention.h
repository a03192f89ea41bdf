#pragma once
// Causal scaled-dot-product attention with grouped KV heads, as HF's eager_attention_forward
// computes it, in fp64 (HF's eager path runs its softmax in float32; the fp64 peer run has to
// patch that, as it does RMSNorm and RoPE).
//
// q [T, H*D] (row t at position q_positions[t]), k and v [S, Hkv*D] (the whole KV cache so far,
// row s at kv_positions[s]). Query t sees key s iff kv_positions[s] <= q_positions[t], and, with a
// sliding window W > 0 (Mistral; HF's sliding_window_overlay), q_positions[t] - kv_positions[s] <
// W: the W most recent positions, its own included. Head h
// reads KV head h / (H / Hkv) (HF repeat_kv: each KV head repeated H/Hkv times, contiguously).
// For each (t, h), over the visible s in ascending order:
//   score_s = (sum_{d ascending} q[t,h,d] * k[s,kvh,d]) * scaling     (HF: matmul, then * scaling)
//   m       = max_s score_s
//   e_s     = std::exp(score_s - m)
//   Z       = sum_{s ascending} e_s
//   p_s     = e_s / Z
// With sinks (gpt-oss, HF eager_attention_forward with module.sinks): head h's sink logit
// sink_h joins the scores as one more column that is dropped after the softmax:
//   m = max(max_s score_s, sink_h),  Z = (sum_{s ascending} e_s) + std::exp(sink_h - m)
//   out[d]  = sum_{s ascending} p_s * v[s,kvh,d]
// Masked keys are skipped; HF adds the dtype's lowest value instead, whose exp is exactly 0 in
// fp64, so skipping changes neither Z nor the output sum. Every output element has one fixed
// reduction order and no threads are used, so results are bit-identical run to run.
#include <cstdint>
#include <span>

#include "schemes/math/matmul.h"

namespace qparity::reference {

// Returns [T, H*D]. Throws qparity::Error ("causal_attention") naming what is wrong: a
// non-positive head count or head_dim, H not a multiple of Hkv, q / k / v widths, k and v row
// counts, position counts, a non-finite scaling or sink, sinks not one per head, or a query that
// sees no key.
Matrix causal_attention(const Matrix& q, const Matrix& k, const Matrix& v,
                        std::span<const int64_t> q_positions, std::span<const int64_t> kv_positions,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scaling,
                        int64_t sliding_window = 0, std::span<const double> sinks = {});

}  // namespace qparity::reference
