#pragma once
// Greedy next-token selection on the device: ids[r] = argmax_v logits[r, v] (fp32), ties to the
// lowest id (torch.argmax's first occurrence), NaN rows give -1. Temperature / top-p sampling runs
// on the host from these logits (gpu_engine/sampler.h).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qparity::gpu {

struct ArgmaxParams {
  const float* logits = nullptr;  // [rows, vocab], row stride vocab
  int32_t* ids = nullptr;         // [rows]
  int64_t rows = 0, vocab = 0;
};

void launch_argmax(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
