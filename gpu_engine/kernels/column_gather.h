#pragma once
// A row's columns gathered into another layout: dst[t, c] = src[t, sources[c]] for c < cols, bf16
// copied bit for bit. Qwen3.5's quantized qkv (rope_layout.h kernel_qkv_sources): the method's
// output in the checkpoint's row order becomes the kernels' [q | k | v | gate] row.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct ColumnGatherParams {
  const __nv_bfloat16* src = nullptr;  // [rows, src_stride]
  __nv_bfloat16* dst = nullptr;        // [rows, dst_stride], not overlapping src
  const int32_t* sources = nullptr;    // [cols], each in [0, src_stride)
  int64_t rows = 0, cols = 0, src_stride = 0, dst_stride = 0;
};

void launch_column_gather(const ColumnGatherParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
