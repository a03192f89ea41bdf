#pragma once
// The sum of a row-parallel layer's partial outputs gathered from the tensor-parallel ranks:
//   out[i] = bf16(sum over r = 0..ranks-1, in rank order, of float(parts[r * count + i]))
// fp32 accumulation, one rounding: vLLM's one-shot custom all-reduce (each rank reads every
// rank's bf16 partial and sums them in fp32). The sum of up to 8 bf16 values is exact in fp32
// unless their exponents span more than 13 binades, so the result is the correctly rounded sum
// of the partials: what the reference's TP emulation computes (tensor_parallel_emulation.h),
// for any rank count, where NCCL's bf16 ring would round after each addition in an order that
// depends on the element's chunk.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct RankSumParams {
  const __nv_bfloat16* parts = nullptr;  // [ranks, count]
  __nv_bfloat16* out = nullptr;          // [count]
  int64_t count = 0;
  int ranks = 0;
};

void launch_rank_sum(const RankSumParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
