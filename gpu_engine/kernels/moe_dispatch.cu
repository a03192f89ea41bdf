#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/moe_dispatch.h"

namespace qparity::gpu {

namespace {

constexpr int kGroupThreads = 1024;

__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams p) {
  extern __shared__ int32_t start[];  // [experts]: counts, then each expert's first sorted pair
  const int tid = threadIdx.x;
  const auto expert_of = [&](int64_t i) {
    const int32_t id = p.ids[i];
    return id >= 0 && id < p.experts ? id : 0;
  };
  for (int64_t x = tid; x < p.experts; x += kGroupThreads)
    start[x] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.pairs; i += kGroupThreads) {
    const int32_t id = p.ids[i];
    if (id < 0 || id >= p.experts) atomicAdd(p.bad, 1);
    atomicAdd(&start[expert_of(i)], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int32_t sum = 0, na = 0;
    for (int64_t x = 0; x < p.experts; ++x) {
      const int32_t c = start[x];
      p.first[x] = start[x] = sum;
      if (c > 0) p.active[1 + na++] = static_cast<int32_t>(x);
      sum += c;
    }
    p.first[p.experts] = sum;
    p.active[0] = na;
  }
  __syncthreads();
  for (int64_t x = tid; x < p.experts; x += kGroupThreads) {
    int32_t at = start[x];
    for (int64_t i = 0; i < p.pairs; ++i)
      if (expert_of(i) == x) {
        p.rows[at] = static_cast<int32_t>(i / p.top_k);
        p.dest[at] = static_cast<int32_t>(i);
        ++at;
      }
  }
}

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

void launch_moe_group_by_expert(const MoeGroupParams& p, cudaStream_t stream) {
  constexpr const char* k = "moe_group_by_expert";
  require(p.ids && p.first && p.rows && p.dest && p.active && p.bad, k,
          "every pointer is required");
  require(p.pairs >= 0 && p.top_k >= 1 && p.pairs % p.top_k == 0, k,
          "pairs must be a multiple of top_k >= 1");
  require(p.experts >= 1 && p.experts <= 12 * 1024, k,
          "experts " + std::to_string(p.experts) + " outside [1, 12288] (shared-memory counts)");
  moe_group_kernel<<<1, kGroupThreads, static_cast<size_t>(p.experts) * 4, stream>>>(p);
  check_launch(k);
}

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
