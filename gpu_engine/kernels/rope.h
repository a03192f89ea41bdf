#pragma once
// Rotary position embedding (Hugging Face rotate-half, the NeoX layout) applied in place to the
// heads of q or k inside a row:
//   angle = double(pos) * inv_freq[i]                 (fp64; i = j mod dim/2)
//   c = cos(angle) * scaling, s = sin(angle) * scaling (fp64)
//   out[j] = bf16(x[j] * c + rotate_half(x)[j] * s),  rotate_half(x) = cat(-x[dim/2:], x[:dim/2])
// fp64 with one rounding, the reference's emulate rule. Angles are fp64 on purpose: in fp32 (as
// HF computes pos * inv_freq) the angle at position 10^5 is off by ~6e-3 rad, an error larger
// than bf16's. inv_freq comes from reference_cpu's Rope (fp64, llama3 scaling included). RoPE
// is a small share of the work, so H100's fp64 rate costs nothing measurable.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct RopeParams {
  __nv_bfloat16* x = nullptr;          // row t, head h at x + t * row_stride + h * head_dim
  const int32_t* positions = nullptr;  // [tokens]
  const double* inv_freq = nullptr;    // [head_dim / 2]
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t row_stride = 0;
  double scaling = 1.0;  // HF attention_scaling (1 for default / linear / llama3)
};

void launch_rope(const RopeParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
