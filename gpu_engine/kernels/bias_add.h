#pragma once
// A per-column bias added to rows of bf16 values in place (ChatGLM2's q/k/v biases after the qkv
// projection): x[r, c] = bf16(float(x[r, c]) + float(bias[c])), the sum exact in fp32 (two bf16
// values), one rounding. The projection's output was itself rounded to bf16, so the engine rounds
// twice where the reference rounds x W^T + b once; the difference is at most one bf16 ulp of the
// output, within the bf16 policy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qparity::gpu {

// rows of `cols` values at x + r * stride; bias [cols].
void launch_add_bias(__nv_bfloat16* x, int64_t rows, int64_t cols, int64_t stride,
                     const __nv_bfloat16* bias, cudaStream_t stream);

}  // namespace qparity::gpu
