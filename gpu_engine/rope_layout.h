#pragma once
// ChatGLM2's RoPE (pairs (x[2i], x[2i+1]) over the first rotary_dim dims of a head, the rest
// passed through: reference_cpu/layers/rope.h) on the engine's rotate-half kernels, exactly.
// Rotate-half rotates the pair (i, i + d/2) by inv_freq[i]; interleaved pair i is the same
// arithmetic on (2i, 2i+1). So q and k are computed with each head's dims re-laid out:
//   logical 2i     -> physical i            (i < rotary_dim / 2; frequency inv_freq[i])
//   logical 2i + 1 -> physical i + d/2
//   logical rotary_dim + m -> the remaining positions in order (first [rotary_dim/2, d/2),
//                             then [d/2 + rotary_dim/2, d)), rotated by a zero frequency:
//                             cos 0 = 1, sin 0 = 0, so x * 1 + y * 0 = x, exact
// by permuting the q_proj / k_proj output rows (weights, biases, per-channel scales, the C8
// key scales and offsets, packed codes: every tensor whose first dimension is the output rows)
// when the checkpoint is loaded. A gated q_proj (Qwen3.5: per head [q (d) | gate (d)] rows)
// moves its q rows only; q / k norm weights ([head_dim], applied before RoPE) move with the dims.
// q.k is a sum over a head's dims, the same products in another order: attention reads the same
// scores. V and the attention output are untouched. Captures of q / k points read the logical
// columns back (the positions below), so dumps never see the re-layout.
#include <cstdint>
#include <vector>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "gpu_engine/capture.h"

namespace qparity::gpu {

// Whether cfg's RoPE needs the re-layout (interleaved or partial rotation).
bool needs_rope_relayout(const ModelConfig& cfg);
// [head_dim]: where logical dim j of a head sits physically (identity when not needed).
std::vector<int64_t> rope_positions(const ModelConfig& cfg);
// [head_dim / 2]: the model's frequencies, then zeros for the passed-through pairs.
std::vector<double> rotate_half_inv_freq(const ModelConfig& cfg);
// `ck` with every q_proj.* / k_proj.* tensor whose first dimension is the projection's output
// rows re-laid out (per head, rope_positions), and msModelSlim W4A8_DYNAMIC's weight (I8
// [rows/2, K], int4 row pairs) unpacked, re-laid out and packed again; one-value tensors
// unchanged; anything else of q or k (block scales, whose blocks would mix heads) an Error
// naming the tensor. With `move_projection_rows` false only the q / k norm weights move: the
// projection's output columns are then gathered into the kernels' row after the GEMM
// (kernel_qkv_sources), which takes every scheme's layout, block scales included.
Checkpoint relayout_rope_rows(Checkpoint ck, const ModelConfig& cfg,
                              bool move_projection_rows = true);

// Qwen3.5's quantized qkv: for each column of the kernels' [q | k | v | gate] row (q and k heads
// re-laid out for RoPE as above), the column of the fused projection's own output, q_proj's per
// head [q (d) | gate (d)] rows then k_proj's and v_proj's, in the checkpoint's order. The
// bf16 loader reaches the same row by moving weight rows; a quantized method's rows (packed
// codes, block scales) are left as its kernel wants them and its output gathered instead.
// Unpadded models only (a quantized linear is never padded).
std::vector<int32_t> kernel_qkv_sources(const ModelConfig& cfg);

// Capture column maps for q (or k) heads as the kernels hold them: logical column h * d + j at
// padded[h * d + rope_positions[j]] (padded: shape_padding.h's map, empty when unpadded); empty
// when neither a re-layout nor padding applies. The qkv variant covers [q | k | v] (v only
// padded).
ColumnMap rope_columns(const ColumnMap& padded, int64_t heads, const ModelConfig& cfg);
ColumnMap rope_qkv_columns(const ColumnMap& padded_qkv, const ModelConfig& cfg);

}  // namespace qparity::gpu
