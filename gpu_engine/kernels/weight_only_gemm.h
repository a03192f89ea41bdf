#pragma once
// Weight-only integer GEMM: y[m, n] = bf16( sum_k x[m, k] * w[n, k] + bias[n] ) with
//   w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],   g = k / group,
// the weights streamed in their integer codes (int8: one byte a code; int4: two codes a byte)
// and dequantized in registers. What msModelSlim W8A16 (per channel / per group, offsets) and
// compressed-tensors pack-quantized INT4/INT8 (W4A16, symmetric or asymmetric) compute. With
// `fp8_codes` the bytes are e4m3fn codes instead and w[n, k] = e4m3(q[n, k]) * scale[n, g] (no
// zeros): FP8 weights with bf16 inputs (compressed-tensors FP8 weight-only per tensor / channel /
// block, MXFP8A16; gpu_engine/quant/fp8_weight_only.h).
//
// Precision: each weight is dequantized in fp32, (q - zero) then one rounding of the product
// with the scale ((q - zero) is exact: integer codes and integral zeros; a non-integral F32
// offset rounds once more; an e4m3 value is exact in fp32); products accumulate in fp32, each lane
// over its own k in ascending order, then a fixed butterfly over the warp; the bias joins in fp32;
// one rounding to bf16. A token's sums never depend on the other tokens of the batch, so results
// are batch-invariant bit for bit, and deterministic run to run.
//
// Layouts (the loader repacks checkpoints into them once, gpu_engine/quant/weight_only_int.h):
//   int8  w [n, k] signed codes, row-major.
//   int4  w [n, k / 2] bytes; code k of a row in byte k / 2, the low nibble first, stored
//         unsigned u = q + 8.
//   scales [n, k / group] fp32 or bf16 (scale_bf16; only when every scale is a bf16 value).
//   zeros  [n, k / group] fp32 (zeros_f32) or int8 (zeros_i8), or neither when every zero is 0.
// Constraints (checked by the launcher): k a multiple of 16 (int8) or 32 (int4), group a multiple
// of the same and dividing k, 16-byte aligned w and x rows.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/expert_groups.h"

namespace qparity::gpu {

// One expert's weight in a grouped launch: what w, scales, zeros and bias are for one layer.
struct WeightOnlyExpert {
  const void* w = nullptr;
  const void* scales = nullptr;
  const float* zeros_f32 = nullptr;
  const int8_t* zeros_i8 = nullptr;
  const float* bias = nullptr;
};

struct WeightOnlyGemmParams {
  const __nv_bfloat16* x = nullptr;  // [m, k] row-major
  const void* w = nullptr;           // codes, layout above
  const void* scales = nullptr;      // [n, k / group], fp32 or bf16
  bool scale_bf16 = false;
  const float* zeros_f32 = nullptr;  // optional, [n, k / group]
  const int8_t* zeros_i8 = nullptr;  // optional, [n, k / group]
  const float* bias = nullptr;       // optional, [n]
  __nv_bfloat16* y = nullptr;        // [m, n] row-major
  int64_t m = 0, n = 0, k = 0, group = 0;
  int bits = 8;            // 4 or 8
  bool fp8_codes = false;  // bits 8 only: e4m3fn codes, no zeros (above)
  // Grouped experts (expert_groups.h): x and y hold the rows grouped by expert, expert e's weight
  // is experts[e] (a device array; every expert with the same bits, group, scale and zero kinds:
  // scale_bf16, and which zeros pointer is set, are read from the table's entries as one kind),
  // m bounds any one expert's rows; w, scales, zeros and bias above are unused.
  ExpertGroups groups;
  const WeightOnlyExpert* experts = nullptr;
  bool has_zeros_f32 = false, has_zeros_i8 = false;  // grouped: the table's zero kind
  // Test-only fault injection: read group g + 1 for the weights of group g (the last group
  // reads itself), the deliberate bug bisect must find. Never set outside tests.
  bool fault_group_off_by_one = false;
};

// Codes per 16-byte load of one lane: the granularity of k and group.
constexpr int64_t weight_only_codes_per_load(int bits) {
  return bits == 8 ? 16 : 32;
}

// The layout rules of the int4 / int8 code rows (k and group multiples of the codes a 16-byte load
// holds, group dividing k), an Error naming `kernel` otherwise (int_group_gemm.h reads them too).
void require_int_weight_layout(const char* kernel, int bits, int64_t k, int64_t group);

void launch_weight_only_gemm(const WeightOnlyGemmParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
