#pragma once
// The decode-shaped linear: Y[M, N] = X[M, K] · W[N, K]^T for a handful of tokens (M <= 4). At
// that M a GEMM is a stream over the weight, and a tensor-core GEMM (cuBLASLt) leaves bandwidth
// on the table: this kernel reads each weight row once with 16-byte non-caching loads, several in
// flight per lane, against X staged in shared memory. Two fusions remove the launches and round
// trips around it:
//   - prologue: RMSNorm of the residual stream, optionally after the residual add (the
//     rms_norm.h semantics: h = bf16(x + add), out = bf16(weight * (h * rsqrt(mean(h^2) + eps))),
//     fp32). Every block recomputes it for its own shared-memory copy; block 0 also stores h in
//     residual_out and the normalized rows in normed_out (the capture points). residual_out may
//     not alias x: other blocks are still reading x.
//   - epilogue: SiLU-and-mul over row pairs (j, j + N/2), the gate and up halves of a fused
//     gate_up weight: y[:, j] = bf16(silu(g) * u) from g, u rounded to bf16 first, exactly what
//     the separate GEMM + silu_and_mul pair stores; gate_up_out optionally receives g and u.
// Precision: bf16 inputs, fp32 products and sums (fma), one rounding of the output to bf16 (or
// fp32 kept). Each output's sum runs in a fixed order that depends on (N, K) and the device's SM
// count, never on M or on the other tokens: bit-identical run to run, and a token's result does
// not depend on the batch it is in. (cuBLASLt, used above kSkinnyMaxM, sums in another order:
// the two agree within the bf16 rounding of the output.)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "gpu_engine/kernels/kernel_probe.h"

namespace qparity::gpu {

// Up to 4 tokens. Measured on an H100 (bench_engine, weights streamed from DRAM, CUDA graph):
// against cuBLASLt 1.03-1.71x at M = 1, 0.94-1.35x at M = 2, 0.83-1.19x at M = 4 (where the fused
// norm still saves a launch), 0.50-0.74x at M = 8, where the per-row FMAs from shared memory,
// not the weight stream, set the time.
constexpr int64_t kSkinnyMaxM = 4;

struct SkinnyGemmParams {
  const __nv_bfloat16* x = nullptr;  // [m, k] contiguous, 16-byte aligned
  const __nv_bfloat16* w = nullptr;  // [n, k] contiguous (the weight as checkpoints store it)
  void* y = nullptr;                 // [m, n] (bf16 or fp32); with silu_mul [m, n / 2] bf16
  bool y_f32 = false;
  int64_t m = 0, n = 0, k = 0;
  // Prologue (norm_weight given): x is the residual stream, normalized before the product.
  const __nv_bfloat16* norm_weight = nullptr;  // [k]
  const __nv_bfloat16* add = nullptr;          // optional: h = bf16(x + add)
  __nv_bfloat16* residual_out = nullptr;       // with add: receives h [m, k]
  __nv_bfloat16* normed_out = nullptr;         // optional: the normalized rows [m, k]
  float eps = 1e-6f;
  // Epilogue.
  bool silu_mul = false;
  __nv_bfloat16* gate_up_out = nullptr;  // optional with silu_mul: the bf16 g and u, [m, n]
  // Grouped (MoE experts, launch_moe_group_by_expert's output, read on the device): group g's
  // rows are x rows [group_first[g], group_first[g + 1]), its weight w + g * w_group_stride, its
  // outputs the same rows of y (and gate_up_out). m is then a bound on any group's rows, and
  // group_active lists the groups with rows (count first); max_active bounds that count. No
  // prologue. Each group's sums run exactly as an ungrouped launch with its own rows would.
  const int32_t* group_first = nullptr;
  const int32_t* group_active = nullptr;
  int64_t max_active = 0, w_group_stride = 0;
  // Greedy argmax fused into the epilogue (fp32 output, not grouped): argmax_keys[m] (zeroed
  // before the launch) ends as the max over token m's outputs of argmax_key(y[m, j], j), one
  // atomicMax per block and token. Decode it with argmax_id: the same id as launch_argmax over y.
  unsigned long long* argmax_keys = nullptr;
  KernelProbe* probe = nullptr;  // optional timeline stamps (kernel_probe.h)
  // M = 1: the single-pass kernel (skinny_gemm_single_pass.h) wherever it covers the shape, with
  // the same bits; false keeps the generic kernel (A/B runs and the test comparing the two).
  bool single_pass = true;
};

// The argmax order as one 64-bit unsigned key: the value's bits mapped to an unsigned order
// (-0 taken as +0, so it ties with +0 as the comparison does), above them the complement of the
// index (ties go to the lowest index), and any NaN above every number. max() over keys is the
// argmax with torch's ties and launch_argmax's NaN rule, in any reduction order.
__host__ __device__ inline unsigned long long argmax_key(float v, uint32_t index) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
#endif
  uint32_t ordered;
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    ordered = 0xffffffffu;  // NaN
  else if ((bits & 0x7fffffffu) == 0)
    ordered = 0x80000000u;  // +-0
  else
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - index);
}
// The id a key names; -1 for a row with a NaN (launch_argmax's rule) or a key never set.
inline int32_t argmax_id(unsigned long long key) {
  if (key == 0 || (key >> 32) == 0xffffffffull) return -1;
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key & 0xffffffffull));
}

// Whether launch_skinny_gemm takes this M and K (X must fit in shared memory).
bool skinny_gemm_fits(int64_t m, int64_t k);
void launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
