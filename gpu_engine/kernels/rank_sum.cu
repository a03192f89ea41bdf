#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/rank_sum.h"

namespace qparity::gpu {

namespace {

__global__ void rank_sum_kernel(RankSumParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  float acc = __bfloat162float(p.parts[i]);
  for (int r = 1; r < p.ranks; ++r)
    acc += __bfloat162float(p.parts[r * p.count + i]);
  p.out[i] = __float2bfloat16_rn(acc);
}

}  // namespace

void launch_rank_sum(const RankSumParams& p, cudaStream_t stream) {
  constexpr const char* k = "rank_sum";
  require(p.parts && p.out, k, "parts and out are required");
  require(p.count >= 0 && p.ranks >= 1 && p.ranks <= 64, k, "count >= 0, 1 <= ranks <= 64");
  if (p.count == 0) return;
  constexpr int kThreads = 256;
  launch_pdl(k, rank_sum_kernel, dim3(static_cast<unsigned>((p.count + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, stream, p);
}

}  // namespace qparity::gpu
