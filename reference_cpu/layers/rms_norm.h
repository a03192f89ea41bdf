#pragma once
// RMSNorm as HF's LlamaRMSNorm / Qwen3RMSNorm compute it, in fp64 (the peer run patches HF's
// float32 cast away, ARCHITECTURE.md "Independent peers"). For one row x of H values:
//
//   variance = (sum_{j=0..H-1} x_j * x_j) / H      sum in ascending j, one fp64 rounding per step
//   r        = 1 / sqrt(variance + eps)            HF: torch.rsqrt(variance + eps); here the
//                                                  correctly rounded sqrt, then a correctly
//                                                  rounded divide (<= 1 ulp from a true rsqrt)
//   y_j      = w_j * (x_j * r)                     HF: weight * (hidden * rsqrt(...)), this order
//   y_j     += b_j                                 only with a bias (msModelSlim anti-outlier
//                                                  norms carry one: y = w * norm(x) + b)
//
// Every step is one fp64 operation in the order written; rows are independent and each row's
// reduction order is fixed, so results are bit-identical whatever the thread count.
#include <cstdint>
#include <span>

#include "schemes/math/matmul.h"

namespace qparity::reference {

// x [T, H]; weight [H]; bias empty or [H]; eps >= 0 and finite. Throws qparity::Error naming
// "rms_norm" and the mismatched size or the bad eps.
Matrix rms_norm(const Matrix& x, std::span<const double> weight, double eps,
                std::span<const double> bias = {});

// Qwen3 q_norm / k_norm: RMSNorm over each head of head_dim values separately (HF applies the
// norm on the [.., heads, head_dim] view). x [T, heads * head_dim], weight [head_dim]; the same
// arithmetic as rms_norm per head (sum ascending within the head, divided by head_dim). Throws
// qparity::Error naming "rms_norm_heads" when x's width is not a multiple of head_dim or the
// weight size differs from head_dim.
Matrix rms_norm_heads(const Matrix& x, int64_t head_dim, std::span<const double> weight,
                      double eps);

}  // namespace qparity::reference
