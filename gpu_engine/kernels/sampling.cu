#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/sampling.h"

namespace qparity::gpu {

namespace {

// One block per row: at batch 1 the whole argmax is one block, so it is wide (1024 threads) and
// reads 16 bytes per load when rows are 16-byte aligned. (value, index) with ties to the lowest
// index is a total order, so the result does not depend on the reduction's shape.
constexpr int kThreads = 1024;

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.x;
  const float* row = p.logits + r * p.vocab;
  float best = -INFINITY;
  int best_i = -1;
  bool nan = false;
  const auto see = [&](float x, int64_t v) {
    nan = nan || isnan(x);
    if (best_i < 0 || better(x, static_cast<int>(v), best, best_i))
      best = x, best_i = static_cast<int>(v);
  };
  if (p.vocab % 4 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t v = threadIdx.x; v < p.vocab / 4; v += kThreads) {
      const float4 x = row4[v];
      see(x.x, 4 * v);
      see(x.y, 4 * v + 1);
      see(x.z, 4 * v + 2);
      see(x.w, 4 * v + 3);
    }
  } else {
    for (int64_t v = threadIdx.x; v < p.vocab; v += kThreads)
      see(row[v], v);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (oi >= 0 && (best_i < 0 || better(ob, oi, best, best_i))) best = ob, best_i = oi;
  }
  nan = __any_sync(0xffffffffu, nan);
  __shared__ float sb[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ int snan;
  if (threadIdx.x == 0) snan = 0;
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    sb[threadIdx.x / 32] = best;
    si[threadIdx.x / 32] = best_i;
    if (nan) atomicOr(&snan, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = sb[0];
    int bi = si[0];
    for (int w = 1; w < kThreads / 32; ++w)
      if (si[w] >= 0 && (bi < 0 || better(sb[w], si[w], b, bi))) b = sb[w], bi = si[w];
    p.ids[r] = snan ? -1 : bi;
  }
}

}  // namespace

void launch_argmax(const ArgmaxParams& p, cudaStream_t stream) {
  constexpr const char* k = "argmax";
  require(p.logits && p.ids, k, "logits and ids are required");
  require(p.rows >= 0 && p.vocab > 0 && p.vocab < (int64_t{1} << 31), k,
          "rows >= 0, vocab in [1, 2^31)");
  if (p.rows == 0) return;
  launch_pdl(k, argmax_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace qparity::gpu
