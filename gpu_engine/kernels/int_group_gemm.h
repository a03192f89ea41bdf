#pragma once
// Integer weights with a scale per K-group times 8-bit per-token activation codes: what
// compressed-tensors' WnA8 / WnAFP8 points compute (W4A8: int4 group-128 weights, int8 per-token
// inputs; W4AFP8: the same weights, e4m3 per-token inputs; schemes/int/pack_quantized_int.h):
//   y[m, n] = bf16( s_x[m] * sum_g s_w[n, g] * sum_{k in g} a[m, k] * (q[n, k] - z[n, g])
//                   + bias[n] ),  g = k / group.
// The activation codes come from the engine's per-token quantizers (int8_gemm.h's, fp8_gemm.h's);
// the weight layout is weight_only_gemm.h's int4 / int8 one.
//
// Precision: each lane's 16-byte step (32 int4 or 16 int8 codes, all in one group) is an exact
// int32 sum of a * (q - z): int8 codes times at most 255 in magnitude, or e4m3 codes as their
// integers on the 2^-9 lattice (e4m3_lattice.cuh, |a| <= 229376) times at most 15 (int4) or 255
// (int8): |sum| < 2^31 in every case. Each sum times its group scale is exact in fp64 for bf16
// scales (31 + 8 significant bits; compressed-tensors' scales) and rounds once for fp32 ones,
// accumulated in fp64 (each lane over its steps, then a fixed
// butterfly), then times 2^-9 for e4m3 codes (exact) and the token's scale, the bias added, all
// in fp64, and rounded once to bf16: the reference's exact group sums scaled in fp64, so the
// outputs are its bf16 values but for fp64's own roundings (~2^-52 relative) near a bf16 tie.
// fp32 accumulation here instead flipped ~1e-3 of the bf16 outputs, and each flip that reached
// the next layer's fp8 codes moved a whole e4m3 step (measured on an H200, the llama fixture:
// 300 of 123648 codes moved in one layer).
// A token's sums never depend on the other tokens: batch-invariant and deterministic.
// Constraints (checked): k and group multiples of 32 (int4) / 16 (int8), group dividing k, zero
// points int8, 16-byte aligned a and w rows.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct IntGroupGemmParams {
  const uint8_t* a = nullptr;       // [m, k] int8 codes, or e4m3fn bytes (a_fp8)
  const float* a_scales = nullptr;  // [m], one per token
  bool a_fp8 = false;
  const uint8_t* w = nullptr;    // weight_only_gemm.h's int4 / int8 layout
  const void* scales = nullptr;  // [n, k / group], fp32 or bf16 (scale_bf16)
  bool scale_bf16 = false;
  const int8_t* zeros_i8 = nullptr;  // optional [n, k / group]
  const float* bias = nullptr;       // optional [n]
  __nv_bfloat16* y = nullptr;        // [m, n]
  int64_t m = 0, n = 0, k = 0, group = 0;
  int bits = 4;  // 4 or 8
};

void launch_int_group_gemm(const IntGroupGemmParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
