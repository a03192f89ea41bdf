#include "gpu_engine/kernels/bias_add.h"
#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

namespace {

__global__ void add_bias_kernel(__nv_bfloat16* x, int64_t rows, int64_t cols, int64_t stride,
                                const __nv_bfloat16* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    __nv_bfloat16& v = x[r * stride + c];
    v = __float2bfloat16_rn(__bfloat162float(v) + __bfloat162float(bias[c]));
  }
}

}  // namespace

void launch_add_bias(__nv_bfloat16* x, int64_t rows, int64_t cols, int64_t stride,
                     const __nv_bfloat16* bias, cudaStream_t stream) {
  if (rows <= 0) return;
  require(x && bias && cols > 0 && stride >= cols, "add_bias",
          "x and bias are required, cols > 0 and stride >= cols");
  const int64_t n = rows * cols;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1024));
  add_bias_kernel<<<blocks, threads, 0, stream>>>(x, rows, cols, stride, bias);
  check_launch("add_bias");
}

}  // namespace qparity::gpu
