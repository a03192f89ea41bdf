#pragma once
// The operations of the deviations (deviation.h) that are not the reference's own: each an
// alternative way to compute one op, with its rounding points stated. `round` is the run dtype's
// rounding of a stored value (bf16 in emulate mode), Arith the precision of an accumulator.
// Used only by CausalLm when a candidate sets a deviation.
#include <cstdint>
#include <span>

#include "reference_cpu/layers/rope.h"
#include "schemes/math/matmul.h"
#include "schemes/math/numeric.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

// The linear with its products and sums accumulated in `acc` (k ascending; every product and
// every addition rounded to acc), on the operands the method's product multiplies: the
// dequantized weight and, for activation-quantized schemes, the dequantized activation codes.
// What the method adds beyond the product (a bias, fp64 scale order) is kept as
// apply(x) - (fp64 product), so only the accumulation differs. Nullopt where the method has
// online transforms (their input is not x).
std::optional<Matrix> accumulate_linear(const LinearMethod& m, const Matrix& x, Arith acc,
                                        int64_t expert = 0);

// RMSNorm of each row with every step in `a`: x_j^2 rounded, the running sum rounded per
// addition, the mean, var + eps, sqrt and 1 / sqrt each rounded, x_j * r and w_j * (.) rounded,
// + b_j rounded.
Matrix rms_norm_in(const Matrix& x, std::span<const double> weight, double eps,
                   std::span<const double> bias, Arith a);

// RMSNorm as transformers' bf16 module: n_j = round(x_j * r) with r the fp64 rsqrt of
// mean(x^2) + eps, then y_j = round(w_j * n_j) (+ b_j, rounded).
Matrix rms_norm_two_roundings(const Matrix& x, std::span<const double> weight, double eps,
                              std::span<const double> bias, Arith a);

// Rotate-half RoPE with cos / sin rounded to `a` and out = round(round(x * cos) +
// round(rotate_half(x) * sin)) per element (transformers' apply_rotary_pos_emb in bf16); dims
// past the rotary dim pass through. Rotate-half models only.
void rotate_half_in(const Rope& rope, Matrix& x, int64_t num_heads,
                    std::span<const int64_t> positions, Arith a);

// The fault: pairs (2i, 2i + 1) rotated by frequency i in fp64, where the model rotates
// (i, i + dim/2).
void rotate_pairs_interleaved(const Rope& rope, Matrix& x, int64_t num_heads,
                              std::span<const int64_t> positions);

// Causal GQA attention (no sliding window, no sinks) as causal_attention computes it except:
// without_max: softmax as fp32 exp(s) / fp32 sum, no max subtracted (inf / NaN where s > 88);
// round_probs: each probability rounded to `a` before P.V.
Matrix attention_variant(const Matrix& q, const Matrix& k, const Matrix& v,
                         std::span<const int64_t> q_positions,
                         std::span<const int64_t> kv_positions, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double scaling, bool without_max,
                         bool round_probs, Arith a);

}  // namespace qparity::reference
