#pragma once
// SiLU-and-mul over a fused gate_up row [gate (inter) | up (inter)]:
//   out[j] = bf16(silu(g) * u),  silu(g) = g / (1 + exp(-g)),  g, u = float(gate[j]), float(up[j])
// fp32, one rounding (the reference's emulate rule; HF eager stores silu(g) in bf16 first).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct SiluAndMulParams {
  const __nv_bfloat16* gate_up = nullptr;  // [rows, 2 * inter], row stride 2 * inter
  __nv_bfloat16* out = nullptr;            // [rows, inter]
  int64_t rows = 0;
  int64_t inter = 0;
};

void launch_silu_and_mul(const SiluAndMulParams& p, cudaStream_t stream);

// Qwen3.5's attention output gate, in place: x[j] = bf16(float(x[j]) * sigmoid(float(gate[j]))),
// sigmoid(g) = 1 / (1 + exp(-g)), fp32, one rounding.
struct SigmoidGateParams {
  __nv_bfloat16* x = nullptr;           // [rows, cols], row stride cols
  const __nv_bfloat16* gate = nullptr;  // [rows, gate_stride]: the gate in [0, cols)
  int64_t gate_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

void launch_sigmoid_gate(const SigmoidGateParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
