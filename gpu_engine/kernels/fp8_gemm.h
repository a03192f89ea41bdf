#pragma once
// FP8 E4M3 activation quantization and the FP8 x FP8 scaled GEMM of `fp8-tensor`,
// `fp8-channel` and `fp8-block` (schemes/fp8/fp8_common.h, FORMATS.md §3.1, §3.2, §4.4).
//
// Quantization reproduces one dialect's rule bit for bit (the reference's Fp8ScaleRule with fp32
// arithmetic, as vLLM and SGLang compute): amax = max|x| over the set (a token, a 1 x group
// slice of a token, or every element for a dynamic per-tensor scale; exact), then
//   s = max(amax, amax_floor) / 448 (fp32, RN), s = max(s, min_scale);  or the static scale;
//   t = x / s, or x * (1 / s) with the reciprocal rounded first (multiply_reciprocal); fp32, RN;
//   code = e4m3fn(clamp(t, -448, 448)), round half to even;
//   s == 0: codes +448 / -448 by sign (zero_saturates, vLLM's x * (1/0) through fminf/fmaxf), else
//   codes 0.
// UE8M0 scale rounding of fp8-block is not implemented here (the reference's group_ue8m0 is off
// for vllm and sglang; a rule asking for it is refused by the GPU method).
// MX (mx_bump, with kDynamicGroup and group 32: `mxfp8`'s activations, schemes/math/
// mx_scale.h, the vllm / sglang / compressed-tensors kBump rule): per 32-group the amax's
// exponent floor(log2 amax) (frexp, exact, subnormals included) plus 1 when its mantissa is
// >= 1.75, minus 8, as an E8M0 byte clamped to [0, 254] (amax 0: byte 0; a bumped power of two
// beyond bf16's range: 254); the scale is that power of two, exactly (2^-127 subnormal);
// t = x / 2^E (exact but for quotients below fp32's normal range, which round to a zero code in
// bf16 as in fp32), clamped to +-448, RNE to e4m3fn. With mx_e2m1 (`mxfp4`) the elements are
// e2m1: minus 2 instead of 8 in the exponent, t clamped to +-6 and rounded half to even on e2m1's
// grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, stored as the e4m3fn byte of that value (exact: e2m1 values
// are e4m3fn values: what the dumps hold), and with q_doubled also as twice the value in int8 (what
// the packed fp4 GEMM, kernels/fp4_gemm.h, reads).
// NVFP4 (nvfp4_global > 0, with kDynamicGroup and group 16: `nvfp4`'s W4A4 activations,
// schemes/fp4/nvfp4.h, vLLM's rule): gs = the static input global scale (a divisor), per
// 16-group s = e4m3(fl32(gs * fl32(amax * fl32(1/6)))) saturating at 448 (0 stays 0), then
// t = fl32(x * fl32(1 / fl32(s * fl32(1/gs)))) (a zero divisor gives 0), NaN -> 0, e2m1 as for
// mx_e2m1; with nvfp4_divide compressed-tensors' arithmetic instead: s = e4m3(fl32(gs *
// fl32(amax / 6))) (0 -> 0.125), t = fl32(x / fl32(s / gs)). `scales` gets s (an e4m3 value, what
// the GEMM multiplies), `reported_scales` (when given) fl32(s / gs), the scale the codes stand for.
// Groups of 16 or 32 dividing k run one thread per element, reducing with warp shuffles.
// GEMM: each lane sums 16 products at a time (exact in fp32: e4m3 x e4m3 needs 8 significant
// bits), then adds chunk * s_b * s_a when the scales vary along K (block scales, 1 x 128 groups)
// or multiplies the whole sum once (y = (acc * s_b) * s_a, CUTLASS's ScaledEpilogue order); then
// times alpha when it is not 1 (NVFP4's 1/(gs_in gs_w)); fp32 throughout, the bias in fp32, one
// rounding to bf16. Batch-invariant and deterministic.
// Constraints (checked): k a multiple of 16, activation groups and weight block columns
// multiples of 16, 16-byte aligned rows.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/expert_groups.h"

namespace qparity::gpu {

enum class Fp8ActMode : uint8_t { kStatic, kDynamicTensor, kDynamicToken, kDynamicGroup };

struct QuantizeFp8Params {
  const __nv_bfloat16* x = nullptr;  // [m, k]
  uint8_t* q = nullptr;              // [m, k] e4m3fn codes
  float* scales = nullptr;           // [m, scale_cols]: one per token (its group's, its tensor's)
  float* tensor_amax = nullptr;      // kDynamicTensor: one float of device scratch
  int64_t m = 0, k = 0;
  Fp8ActMode mode = Fp8ActMode::kDynamicToken;
  int64_t group = 128;     // kDynamicGroup
  float static_scale = 0;  // kStatic
  bool multiply_reciprocal = false;
  float amax_floor = 0, min_scale = 0;
  bool zero_saturates = false;
  bool mx_bump = false;              // kDynamicGroup, group 32: E8M0 scales (above)
  bool mx_e2m1 = false;              // with mx_bump: e2m1 elements
  float nvfp4_global = 0;            // > 0: NVFP4 activations under this input global scale
  bool nvfp4_divide = false;         // compressed-tensors' arithmetic (above)
  float* reported_scales = nullptr;  // NVFP4: optional [m, groups] fl32(s / gs)
  int8_t* q_doubled = nullptr;       // e2m1 elements: optional [m, k] twice the values (fp4_gemm.h)
  // Optional second copy of `scales`, token-contiguous: [groups][group_major_rows] with
  // group_major_rows >= m (the block-scaled layout cuBLASLt reads, fp8_blas.h, whose token count
  // may be m padded); the entries of rows >= m are left as they are.
  float* scales_group_major = nullptr;
  int64_t group_major_rows = 0;
  // With one scale per token (not kDynamicGroup): that scale written this many times, once per
  // group row of scales_group_major (cuBLASLt's per-128-column form of a per-token scale).
  int64_t group_major_repeat = 1;
};

// Columns of the scale grid per token for a mode.
int64_t fp8_act_scale_cols(Fp8ActMode mode, int64_t k, int64_t group);

void launch_quantize_fp8(const QuantizeFp8Params& p, cudaStream_t stream);

// One expert's weight in a grouped fp8 GEMM: what b, b_scales and bias are for one layer.
struct Fp8Expert {
  const uint8_t* b = nullptr;
  const float* b_scales = nullptr;
  const float* bias = nullptr;
};

struct Fp8GemmParams {
  const uint8_t* a = nullptr;       // [m, k] e4m3fn
  const float* a_scales = nullptr;  // [m, a_scale_cols]
  int64_t a_group = 0;              // columns per activation scale (k when one per token)
  const uint8_t* b = nullptr;       // [n, k] e4m3fn
  const float* b_scales = nullptr;  // [ceil(n / b_block_rows), ceil(k / b_block_cols)]
  int64_t b_block_rows = 1, b_block_cols = 0;
  const float* bias = nullptr;  // optional [n]
  float alpha = 1.f;            // times the sum before the bias (NVFP4's 1/(gs_in gs_w))
  __nv_bfloat16* y = nullptr;   // [m, n]
  int64_t m = 0, n = 0, k = 0;
  // Grouped experts (expert_groups.h): a, a_scales and y hold the rows grouped by expert, expert
  // e's weight is experts[e] (a device array, every expert with the same block geometry and
  // alpha), m bounds any one expert's rows; b, b_scales and bias above are unused.
  ExpertGroups groups;
  const Fp8Expert* experts = nullptr;
};

void launch_fp8_scaled_gemm(const Fp8GemmParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
