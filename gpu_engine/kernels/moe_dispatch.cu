#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/moe_dispatch.h"

namespace qparity::gpu {

namespace {

__global__ void gather_rows_kernel(GatherRowsParams p) {
  const int64_t i = blockIdx.x;
  const int64_t r = p.rows[i];
  if (r < 0 || r >= p.src_rows) return;  // checked on the host before the launch
  for (int64_t j = threadIdx.x; j < p.width; j += blockDim.x)
    p.dst[i * p.width + j] = p.src[r * p.width + j];
}

__global__ void scatter_rows_kernel(ScatterRowsParams p) {
  const int64_t i = blockIdx.x;
  const int64_t r = p.dest[i];
  if (r < 0 || r >= p.dst_rows) return;
  for (int64_t j = threadIdx.x; j < p.width; j += blockDim.x)
    p.dst[r * p.width + j] = p.src[i * p.width + j];
}

__global__ void moe_combine_kernel(MoeCombineParams p) {
  const int64_t t = blockIdx.x;
  // Slot order by ascending expert id (insertion sort of at most 32 slots, per thread: cheap).
  int order[32];
  const int k = static_cast<int>(p.top_k);
  for (int j = 0; j < k; ++j) {
    int pos = j;
    while (pos > 0 && p.ids[t * k + order[pos - 1]] > p.ids[t * k + j]) {
      order[pos] = order[pos - 1];
      --pos;
    }
    order[pos] = j;
  }
  for (int64_t c = threadIdx.x; c < p.hidden; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int s = order[j];
      acc += p.weights[t * k + s] * __bfloat162float(p.slots[(t * k + s) * p.hidden + c]);
    }
    p.out[t * p.hidden + c] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  constexpr const char* k = "gather_rows";
  require(p.src && p.rows && p.dst, k, "src, rows and dst are required");
  require(p.count >= 0 && p.width > 0 && p.src_rows >= 0, k, "count >= 0, width > 0");
  if (p.count == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(p.count), 128, 0, stream>>>(p);
  check_launch(k);
}

void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream) {
  constexpr const char* k = "scatter_rows";
  require(p.src && p.dest && p.dst, k, "src, dest and dst are required");
  require(p.count >= 0 && p.width > 0 && p.dst_rows >= 0, k, "count >= 0, width > 0");
  if (p.count == 0) return;
  scatter_rows_kernel<<<static_cast<unsigned>(p.count), 128, 0, stream>>>(p);
  check_launch(k);
}

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  constexpr const char* k = "moe_combine";
  require(p.slots && p.ids && p.weights && p.out, k, "every pointer is required");
  require(p.top_k >= 1 && p.top_k <= 32 && p.hidden > 0 && p.tokens >= 0, k,
          "top_k in [1, 32], hidden > 0, tokens >= 0");
  if (p.tokens == 0) return;
  moe_combine_kernel<<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  check_launch(k);
}

}  // namespace qparity::gpu
