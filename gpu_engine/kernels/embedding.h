#pragma once
// Embedding gather: out[t] = table[ids[t]] (bf16 rows copied bit for bit). An id outside
// [0, vocab) writes a NaN row and counts itself in *bad_ids (device int, optional), so a bad
// token is visible in the output and to the caller rather than reading another row.
// Vocab-parallel (tensor parallelism): the table holds rows [vocab_begin, vocab_begin + vocab)
// of the whole vocabulary; an id outside them writes a zero row, which the ranks' all-reduce
// fills from the rank that owns it (x + 0 = x: exact). The host checks ids against the whole
// vocabulary first.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/kernel_probe.h"

namespace qparity::gpu {

struct EmbeddingParams {
  const int32_t* ids = nullptr;          // [tokens]
  const __nv_bfloat16* table = nullptr;  // [vocab, hidden]
  __nv_bfloat16* out = nullptr;          // [tokens, hidden]
  int32_t* bad_ids = nullptr;            // optional device counter
  int64_t tokens = 0;
  int64_t vocab = 0;
  int64_t hidden = 0;
  bool vocab_shard = false;
  int64_t vocab_begin = 0;
  KernelProbe* probe = nullptr;  // optional timeline stamps (kernel_probe.h)
};

void launch_embedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
