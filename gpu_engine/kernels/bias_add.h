#pragma once
// A per-column bias joined to an unquantized projection's fp32 output (ChatGLM2's q/k/v biases):
// out[r, c] = bf16(y[r, c] + bias[c]), y the GEMM's fp32 sums, the bias fp32 (exact for a bf16,
// fp16 or fp32 checkpoint bias), the sum rounded to fp32 and then once to bf16: what F.linear
// with a bias does (cuBLASLt's bias epilogue) and what the reference computes, x W^T + b rounded
// once. (Rounding the GEMM's output to bf16 before the add would round twice; measured on the
// ChatGLM2 fixtures that alone moves the median token's rel_l2 past the bf16 policy.) Quantized
// linear methods take their bias in their own fp32 epilogue instead.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qparity::gpu {

// y [rows, cols] fp32 contiguous, bias [cols], out [rows, cols] bf16 contiguous.
void launch_bias_to_bf16(const float* y, const float* bias, __nv_bfloat16* out, int64_t rows,
                         int64_t cols, cudaStream_t stream);

}  // namespace qparity::gpu
