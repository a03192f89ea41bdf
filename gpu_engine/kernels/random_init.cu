#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/random_init.h"

namespace qparity::gpu {

namespace {

__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(__nv_bfloat16* out, int64_t n, float mean, float std, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix(seed ^ splitmix(static_cast<uint64_t>(i)));
    float s = 0.f;
    for (int j = 0; j < 4; ++j)
      s += static_cast<float>((h >> (16 * j)) & 0xFFFF) * (1.f / 65536.f);
    // Sum of 4 U(0,1): mean 2, variance 4/12.
    out[i] = __float2bfloat16_rn(mean + std * (s - 2.f) * 1.7320508f);
  }
}

}  // namespace

void launch_fill_random_bf16(__nv_bfloat16* out, int64_t n, float mean, float std, uint64_t seed,
                             cudaStream_t stream) {
  require(out || n == 0, "fill_random_bf16", "out is required");
  require(n >= 0, "fill_random_bf16", "n >= 0");
  if (n == 0) return;
  fill_kernel<<<1024, 256, 0, stream>>>(out, n, mean, std, seed);
  check_launch("fill_random_bf16");
}

}  // namespace qparity::gpu
