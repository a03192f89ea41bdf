#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/rope.h"

namespace qparity::gpu {

namespace {

// One thread per rotation pair (j, j + dim/2) of one head of one token.
__global__ void rope_kernel(RopeParams p) {
  const int64_t half = p.head_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.tokens * p.heads * half) return;
  const int64_t i = idx % half, h = (idx / half) % p.heads, t = idx / (half * p.heads);
  __nv_bfloat16* v = p.x + t * p.row_stride + h * p.head_dim;
  const double angle = static_cast<double>(p.positions[t]) * p.inv_freq[i];
  double c, sn;
  sincos(angle, &sn, &c);
  c *= p.scaling;
  sn *= p.scaling;
  const double x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
  v[i] = __double2bfloat16(x1 * c - x2 * sn);
  v[i + half] = __double2bfloat16(x2 * c + x1 * sn);
}

}  // namespace

void launch_rope(const RopeParams& p, cudaStream_t stream) {
  constexpr const char* k = "rope";
  require(p.x && p.positions && p.inv_freq, k, "x, positions and inv_freq are required");
  require(p.head_dim > 0 && p.head_dim % 2 == 0, k,
          "head_dim " + std::to_string(p.head_dim) + " must be positive and even");
  require(p.tokens >= 0 && p.heads > 0, k, "tokens >= 0, heads > 0");
  require(p.row_stride >= p.heads * p.head_dim, k, "row_stride < heads * head_dim");
  const int64_t n = p.tokens * p.heads * (p.head_dim / 2);
  if (n == 0) return;
  constexpr int kThreads = 256;
  rope_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  check_launch(k);
}

}  // namespace qparity::gpu
