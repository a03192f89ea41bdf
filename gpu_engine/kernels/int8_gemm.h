#pragma once
// INT8 activation quantization and the INT8 x INT8 scaled GEMM of `w8a8-int8-dyn`
// (schemes/int/w8a8_int8_dynamic.h, FORMATS.md §3.3, §4.5) and of `w4a8-dyn`, whose int4
// weight codes are held widened to int8 (the same integers: the accumulation is identical).
//
// Per-token quantization, one dialect's arithmetic bit for bit (the reference's Int8ActRules):
//   vllm    amax = max|x| (exact, fp32 of bf16); s = amax / 127 (fp32, RN); q = cvt.rni.sat(x *
//           (127 / amax)) with 127 / amax and the product in fp32 (RN), round half to even,
//           saturating to [-128, 127]; an all-zero token gets s = 0, q = 0.
//   sglang  amax = max(max|x|, fp32(1e-10)); s, 127 / amax and x * (127 / amax) in fp32; round
//           half away from zero (Triton's round), clamped to [-128, 127].
//   npu     torch_npu's npu_dynamic_quant, which every runtime of msModelSlim W4A8_DYNAMIC calls
//           (schemes/int/w4a8_dynamic.h): m = 127 / amax (fp32, RN), s = 1 / m (fp32,
//           RN: not amax / 127), q = rint(x * m) in fp32, half to even, within [-127, 127]; an
//           all-zero token gets s = 0, q = 0.
// GEMM: acc[m, n] = sum_k a[m, k] * b[n, k] as an exact int32 (dp4a; no order dependence), then
// y = bf16( s_a[m] * (s_b[n] * float(acc + acc_bias[n])) + bias[n] ) in fp32, CUTLASS's
// ScaledEpilogue order
// (vLLM cutlass_scaled_mm): float(acc) is exact up to 2^24, then two products, each rounded once.
// A token's row never depends on the batch: batch-invariant and deterministic bit for bit.
// Constraints (checked): k a multiple of 16, 16-byte aligned rows.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qparity::gpu {

enum class Int8ActDialect : uint8_t { kVllm, kSglang, kNpu };

struct QuantizeInt8Params {
  const __nv_bfloat16* x = nullptr;  // [m, k]
  int8_t* q = nullptr;               // [m, k]
  float* scales = nullptr;           // [m]
  int64_t m = 0, k = 0;
  Int8ActDialect dialect = Int8ActDialect::kVllm;
};

void launch_quantize_int8_per_token(const QuantizeInt8Params& p, cudaStream_t stream);

// Static per-tensor quantization (msModelSlim W8A8 / W8A8S; compressed-tensors static inputs):
// q = clamp(rint(v + offset)) with v = x * factor (the reciprocal as the dialect computed it)
// or x / scale, each step in fp32, round half to even; with offset_after_round
// q = clamp(rint(v) + offset) (vLLM's static_scaled_int8_azp_quant_kernel: the zero point added
// to the rounded integer). The raw codes (offset included: the GEMM's acc_bias carries its
// correction). scales[m] = scale for every token (what the dump's x_scales holds).
struct QuantizeInt8StaticParams {
  const __nv_bfloat16* x = nullptr;  // [m, k]
  int8_t* q = nullptr;               // [m, k]
  float* scales = nullptr;           // [m]
  int64_t m = 0, k = 0;
  float scale = 1.f, factor = 0.f, offset = 0.f;
  bool divide = false;
  bool offset_after_round = false;
};

void launch_quantize_int8_static(const QuantizeInt8StaticParams& p, cudaStream_t stream);

struct Int8GemmParams {
  const int8_t* a = nullptr;        // [m, k] activation codes
  const float* a_scales = nullptr;  // [m]
  const int8_t* b = nullptr;        // [n, k] weight codes
  const float* b_scales = nullptr;  // [n]
  const float* bias = nullptr;      // optional [n]
  // Optional [n] int32 terms added to the exact accumulator before the epilogue (msModelSlim's
  // quant_bias); a_scales may then be null (1).
  const int32_t* acc_bias = nullptr;
  __nv_bfloat16* y = nullptr;  // [m, n]
  int64_t m = 0, n = 0, k = 0;
};

void launch_int8_scaled_gemm(const Int8GemmParams& p, cudaStream_t stream);

// Batches above this many tokens take cuBLASLt's int8 tensor cores for the integer product (into
// `acc_scratch`, [m, n] int32) and then the same epilogue as a separate kernel: the integer sums
// are exact either way, so both paths give the same bits (batch invariance holds across the
// threshold). Smaller batches, and shapes cuBLASLt has no int8 algorithm for, use the dp4a
// kernel above.
inline constexpr int64_t kInt8BlasMinTokens = 16;
// Bytes of int32 scratch int8_scaled_gemm needs for m tokens of n outputs (0 at or below the
// threshold).
size_t int8_gemm_scratch_bytes(int64_t m, int64_t n);
void int8_scaled_gemm(const Int8GemmParams& p, int32_t* acc_scratch, cudaStream_t stream);

}  // namespace qparity::gpu
