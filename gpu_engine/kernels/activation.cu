#include "gpu_engine/kernels/activation.h"
#include "gpu_engine/kernels/launch_check.h"
#include "gpu_engine/kernels/pdl.h"

namespace qparity::gpu {

namespace {

__global__ void silu_and_mul_kernel(SiluAndMulParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.rows * p.inter) return;
  const int64_t t = idx / p.inter, j = idx % p.inter;
  const float g = __bfloat162float(p.gate_up[t * 2 * p.inter + j]);
  const float u = __bfloat162float(p.gate_up[t * 2 * p.inter + p.inter + j]);
  p.out[idx] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}

__global__ void sigmoid_gate_kernel(SigmoidGateParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.rows * p.cols) return;
  const int64_t t = idx / p.cols, j = idx % p.cols;
  const float g = __bfloat162float(p.gate[t * p.gate_stride + j]);
  p.x[idx] = __float2bfloat16_rn(__bfloat162float(p.x[idx]) * (1.f / (1.f + expf(-g))));
}

}  // namespace

void launch_sigmoid_gate(const SigmoidGateParams& p, cudaStream_t stream) {
  constexpr const char* k = "sigmoid_gate";
  require(p.x && p.gate, k, "x and gate are required");
  require(p.rows >= 0 && p.cols > 0 && p.gate_stride >= p.cols, k,
          "rows >= 0, cols > 0, gate_stride >= cols");
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  launch_pdl(k, sigmoid_gate_kernel, dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, stream, p);
}

void launch_silu_and_mul(const SiluAndMulParams& p, cudaStream_t stream) {
  constexpr const char* k = "silu_and_mul";
  require(p.gate_up && p.out, k, "gate_up and out are required");
  require(p.rows >= 0 && p.inter > 0, k, "rows >= 0, inter > 0");
  const int64_t n = p.rows * p.inter;
  if (n == 0) return;
  constexpr int kThreads = 256;
  launch_pdl(k, silu_and_mul_kernel, dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)),
             dim3(kThreads), 0, stream, p);
}

}  // namespace qparity::gpu
