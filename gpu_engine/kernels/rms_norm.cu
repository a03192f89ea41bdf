#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"
#include "gpu_engine/kernels/rms_norm.h"

namespace qparity::gpu {

namespace {

constexpr int kThreads = 128;

__global__ void rms_norm_kernel(RmsNormParams p) {
  probe_entry(p.probe);
  pdl_launch_dependents();
  pdl_wait();
  probe_release(p.probe);
  const int64_t vec = blockIdx.x;
  const int64_t row = vec / p.vectors_per_row, sub = vec % p.vectors_per_row;
  const int64_t base = row * p.row_stride + sub * p.dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    float h = __bfloat162float(p.x[base + i]);
    if (p.residual) {
      const __nv_bfloat16 hb = __float2bfloat16_rn(h + __bfloat162float(p.residual[base + i]));
      if (p.residual_out) p.residual_out[base + i] = hb;
      h = __bfloat162float(hb);
    }
    sum += h * h;
  }
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w)
    total += partial[w];  // every thread sums the same partials in the same order
  const float r = rsqrtf(total / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) {
    // h again: this thread wrote residual_out[base + i] itself, or recomputes the sum.
    float h;
    if (!p.residual)
      h = __bfloat162float(p.x[base + i]);
    else if (p.residual_out)
      h = __bfloat162float(p.residual_out[base + i]);
    else
      h = __bfloat162float(__float2bfloat16_rn(__bfloat162float(p.x[base + i]) +
                                               __bfloat162float(p.residual[base + i])));
    float y = (__bfloat162float(p.weight[i]) + p.weight_offset) * (h * r);
    if (p.bias) y += p.bias[i];
    p.out[base + i] = __float2bfloat16_rn(y);
  }
  probe_exit(p.probe);
}

}  // namespace

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  constexpr const char* k = "rms_norm";
  require(p.x && p.weight && p.out, k, "x, weight and out are required");
  require(p.rows >= 0 && p.vectors_per_row > 0 && p.dim > 0, k,
          "rows >= 0, vectors_per_row > 0, dim > 0");
  require(p.row_stride >= p.vectors_per_row * p.dim, k,
          "row_stride " + std::to_string(p.row_stride) + " < vectors_per_row * dim");
  require(!p.residual_out || p.residual, k, "residual_out without residual");
  require(p.eps >= 0, k, "eps must be >= 0");
  require(!p.residual_out || p.out != p.residual_out, k, "out and residual_out are one buffer");
  // With a residual and no residual_out, out may not alias residual or x: the second pass
  // recomputes h from them.
  require(!(p.residual && !p.residual_out && (p.out == p.x || p.out == p.residual)), k,
          "out aliases an input that the second pass re-reads; give residual_out");
  if (p.rows == 0) return;
  launch_pdl(k, rms_norm_kernel, dim3(static_cast<unsigned>(p.rows * p.vectors_per_row)),
             dim3(kThreads), 0, stream, p);
}

}  // namespace qparity::gpu
