#include "gpu_engine/kernels/bias_add.h"

#include <algorithm>

#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

namespace {

__global__ void bias_to_bf16_kernel(const float* y, const float* bias, __nv_bfloat16* out,
                                    int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = __float2bfloat16_rn(y[i] + bias[i % cols]);
}

}  // namespace

void launch_bias_to_bf16(const float* y, const float* bias, __nv_bfloat16* out, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return;
  require(y && bias && out && cols > 0, "bias_to_bf16", "y, bias and out are required, cols > 0");
  const int64_t n = rows * cols;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1024));
  bias_to_bf16_kernel<<<blocks, threads, 0, stream>>>(y, bias, out, rows, cols);
  check_launch("bias_to_bf16");
}

}  // namespace qparity::gpu
