#pragma once
// An image prompt's rows of the residual stream (decoder.h; Qwen3-VL): the placeholders'
// embeddings replaced by the vision tower's features, and after each of the first layers its
// deepstack feature added to the same rows:
//   set   x[rows[j]] = src[j]
//   add   x[rows[j]] = bf16(float(x[rows[j]]) + float(src[j]))   (fp32, one rounding: the stream
//                                                                  is a bf16 tensor)
// The features come from the reference's vision tower in fp64, rounded once to bf16 on upload.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct ImageRowsParams {
  __nv_bfloat16* x = nullptr;          // [tokens, hidden]
  const int32_t* rows = nullptr;       // [count], each in [0, tokens)
  const __nv_bfloat16* src = nullptr;  // [count, hidden]
  int64_t count = 0, hidden = 0;
  bool add = false;
};

void launch_image_rows(const ImageRowsParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
