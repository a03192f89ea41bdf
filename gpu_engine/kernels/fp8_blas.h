#pragma once
// The FP8 x FP8 scaled GEMM of `fp8-tensor`, `fp8-channel` and `fp8-block` on Hopper's fp8 tensor
// cores, through cuBLASLt's scaling modes (cuBLAS 12.9+, compute capability 9.0), in the layout
// every linear of the engine uses: y[m, n] = A[m, k] (activation codes) . B[n, k]^T (weight
// codes), both e4m3fn, y bf16.
//
// The modes express the schemes' scale placement exactly (cuBLAS's "Outer vector scaling" and
// "128-element 1D and 128x128 2D block scaling"):
//   kOuterVector  y[i, j] = bf16( alpha * sa[i] * sb[j] * sum_k a[i, k] b[j, k] + bias[j] ):
//                 a scale per token (dynamic per token, or the one static / dynamic tensor scale
//                 repeated) and a scale per output row (per channel, or a partition's tensor scale
//                 repeated over its rows);
//   kRow128       y[i, j] = bf16( alpha * sum_g sa[g][i] * sb[g][j] * sum_{k in g} a b + bias[j] ),
//                 g the 128-column groups: per-token and per-row scales again, each repeated over
//                 the groups (the same products; cuBLASLt then promotes every 128 columns, where
//                 the scales multiply, which the outer-vector mode does not: measured, its
//                 errors are up to 5x larger on the engine fixtures, ENGINE.md);
//   kBlock128     y[i, j] = bf16( alpha * sum_g sa[g][i] * sb[j / 128][g] * sum_{k in g} a b
//                 + bias[j] ): vLLM / SGLang's fp8-block (1 x 128 activation groups, 128 x 128
//                 weight blocks, DeepSeek-V3's recipe).
// Precision: every e4m3 x e4m3 product is exact; fast accumulation is off, so cuBLASLt promotes
// the tensor cores' partial sums to fp32 periodically (and, with block scales, per 128-column
// group, where each group's scales multiply it); split-K partial sums, if the algorithm splits,
// stay fp32 (the compute-type reduction scheme); the bias is added in fp32 and the result rounded
// once to bf16. Hopper's fp8 MMA does not add its products with IEEE fp32 roundings inside one
// promotion interval, so results are not the CUDA-core kernel's (fp8_gemm.h) bit for bit: both
// are checked against the fp64 reference within the same bound. One algorithm per (m, n, k,
// mode, bias) from cuBLASLt's heuristic, reused: deterministic run to run; a token's row may
// differ in the last bits between batch sizes (not batch-invariant, unlike the CUDA-core kernel).
//
// Scale layouts (cuBLAS's, the launcher does not reorder):
//   kOuterVector  a_scales [m], b_scales [n].
//   kRow128       a_scales [ceil(k / 128)][m], b_scales [ceil(k / 128)][n] (token- and
//                 row-contiguous: "M-major" and "N-major").
//   kBlock128     a_scales [ceil(k / 128)][m]: token-contiguous ("N-major" for cuBLASLt's B);
//                 b_scales [ceil(n / 128)][fp8_blas_block_cols(k)]: group-contiguous, each row
//                 of blocks padded to a multiple of 4 ("K-major", column stride a multiple of 4).
// Constraints: m and n multiples of 4 (block scaling's rule, kept for both modes), k a multiple
// of 16, 16-byte aligned pointers. Anything else, or a shape cuBLASLt has no algorithm for:
// fp8_blas_gemm returns false and launches nothing (the caller runs the CUDA-core kernel).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

enum class Fp8BlasScales : uint8_t { kOuterVector, kRow128, kBlock128 };

struct Fp8BlasParams {
  const uint8_t* a = nullptr;  // [m, k] e4m3fn activation codes
  const float* a_scales = nullptr;
  const uint8_t* b = nullptr;  // [n, k] e4m3fn weight codes
  const float* b_scales = nullptr;
  const __nv_bfloat16* bias = nullptr;  // optional [n] (bf16: cuBLASLt's bias type for bf16 out)
  float alpha = 1.f;
  __nv_bfloat16* y = nullptr;  // [m, n]
  int64_t m = 0, n = 0, k = 0;
  Fp8BlasScales scales = Fp8BlasScales::kOuterVector;
};

// Columns of one weight block row in the kBlock128 layout: ceil(k / 128) rounded up to 4.
constexpr int64_t fp8_blas_block_cols(int64_t k) {
  return ((k + 127) / 128 + 3) / 4 * 4;
}

// Whether the launch ran (false: nothing launched, see above).
bool fp8_blas_gemm(const Fp8BlasParams& p, cudaStream_t stream);

// Makes this host thread's cuBLASLt handle and workspace (each thread has its own: the ranks of a
// tensor-parallel engine run on their own threads and devices). Called at upload, outside any
// CUDA graph capture, which could not allocate the workspace.
void fp8_blas_prepare();

}  // namespace qparity::gpu
