#pragma once
// RMSNorm over bf16 vectors, optionally fused with the residual add before it:
//   h   = bf16(x + residual)                      (the residual stream is a bf16 tensor)
//   r   = 1 / sqrt(mean(float(h)^2) + eps)         (fp32 sum over the vector, fp32 rsqrt)
//   out = bf16((float(weight) [+ weight_offset]) * float(h) * r [+ bias]) (fp32, one rounding)
// One rounding per stored tensor is the reference's emulate-mode rule (and what fused engine
// kernels do); HF eager also rounds h * r to bf16 before the weight, one extra rounding.
// Vectors: `rows` rows of `vectors_per_row` vectors of `dim` values, vector v of row t at
// t * row_stride + v * dim (elements). So one launch normalizes hidden states (vectors_per_row 1)
// or, for Qwen3's q_norm / k_norm, every head of q or k inside a fused qkv row.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/kernel_probe.h"

namespace qparity::gpu {

struct RmsNormParams {
  const __nv_bfloat16* x = nullptr;
  const __nv_bfloat16* residual = nullptr;  // optional: h = x + residual
  __nv_bfloat16* residual_out = nullptr;    // with residual: receives h (may alias residual)
  const __nv_bfloat16* weight = nullptr;    // [dim]
  __nv_bfloat16* out = nullptr;             // may alias x
  int64_t rows = 0;
  int64_t vectors_per_row = 1;
  int64_t dim = 0;
  int64_t row_stride = 0;  // elements between rows of x, residual and out
  float eps = 1e-6f;
  KernelProbe* probe = nullptr;  // optional timeline stamps (kernel_probe.h)
  // Optional [dim] fp32 bias after the weight (msModelSlim's anti-outlier norms, smooth-quant):
  // out = bf16(float(weight) * (h * r) + bias), the bias added in fp32.
  const float* bias = nullptr;
  // Zero-centred norms (Qwen3.5: x̂ * (1 + w)) give 1: the weight used is float(w) + offset,
  // added in fp32 (the bf16 weight itself is never rounded again).
  float weight_offset = 0.f;
};

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
