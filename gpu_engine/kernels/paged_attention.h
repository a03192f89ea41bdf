#pragma once
// Causal attention over a paged KV cache, for prefill and decode alike (one kernel, so a prefill
// and the decode steps that follow see the same arithmetic), with grouped-query heads.
//
// Cache: k_cache and v_cache [num_blocks, block_size, num_kv_heads, head_dim], bf16 or a
// quantized format (kv_quant.h: the kernels read every element dequantized to bf16). Sequence s's
// position p lives in block block_table[s * max_blocks_per_seq + p / block_size], slot
// p % block_size. launch_kv_cache_write stores new tokens' K and V there; launch_paged_attention
// then lets token i (sequence seq[i], position pos[i]) attend to positions 0..pos[i] of its
// sequence.
//
// Precision: q.k in fp32 from bf16 inputs, softmax online in fp32 (running max, exp, running
// sum), probabilities times V accumulated in fp32, the output rounded once to bf16 - the
// flash-attention semantics, not HF eager's (which rounds scores and probabilities to bf16).
// Keys are visited in a fixed order independent of the batch: a token's output does not depend
// on what else is in the batch, and runs are bit-identical.
//
// Split keys (flash-decoding): token i's keys 0..pos[i] are cut into chunks of `chunk` positions
// (a multiple of 128), each chunk one block, so a decode step with few tokens still fills the
// GPU. A chunk's softmax state (running max, sum, fp32 accumulator) goes to scratch; the last of
// the token's chunk blocks to finish merges them in chunk order. The cut depends only on the
// position and `chunk`, never on the batch: for a given chunk, prefill and decode, alone or
// batched, give the same bits. (The engine runs decode-sized batches through decode_attention.h,
// and this kernel with one chunk covering the context for larger ones; the two agree within the
// bf16 rounding of the output.)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::gpu {

struct KvCacheWriteParams {
  const __nv_bfloat16* k = nullptr;  // token i's K heads at k + i * k_stride
  const __nv_bfloat16* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  void* k_cache = nullptr;  // elements of kv.format, quantized on write
  void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* seq = nullptr;  // [tokens]
  const int32_t* pos = nullptr;  // [tokens]
  int64_t tokens = 0, num_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0, num_blocks = 0;
  KvQuant kv = {};
};

// The inverse, for the k_cache / v_cache capture points: what the cache holds at each token's
// (seq[i], pos[i]), read back as the attention kernels read it (bf16), into k and v
// [tokens, num_kv_heads * head_dim] (row strides k_stride, v_stride).
struct KvCacheReadParams {
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  const int32_t* block_table = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  int64_t tokens = 0, num_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0;
  KvQuant kv = {};
};

struct PagedAttentionParams {
  const __nv_bfloat16* q = nullptr;  // token i, head h at q + i * q_stride + h * head_dim
  int64_t q_stride = 0;
  const void* k_cache = nullptr;  // elements of kv.format (kv_quant.h), dequantized on read
  const void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  __nv_bfloat16* out = nullptr;  // token i, head h at out + i * out_stride + h * head_dim
  int64_t out_stride = 0;
  int64_t tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0;
  float scale = 0;  // 1/sqrt(head_dim) for Llama / Qwen3
  // Key chunks: positions must be < chunk * max_chunks (a token beyond gets NaN outputs: it
  // would otherwise silently lose keys). With max_chunks > 1, the scratch is required:
  int64_t chunk = 128, max_chunks = 1;
  float* partial_acc = nullptr;     // [tokens, num_heads, max_chunks, head_dim]
  float* partial_ml = nullptr;      // [tokens, num_heads, max_chunks, 2]: max, sum
  uint32_t* chunks_done = nullptr;  // [tokens, num_heads], zero; each launch leaves it zero
  KvQuant kv = {};                       // the cache's format (last: positional initializers)
};

// The scratch sizes for a launch of up to `tokens` tokens (floats, floats, counters).
struct AttentionScratchSize {
  int64_t acc = 0, ml = 0, counters = 0;
};
AttentionScratchSize paged_attention_scratch(int64_t tokens, int64_t num_heads, int64_t head_dim,
                                             int64_t max_chunks);

// The checks every attention launcher over this cache makes (a qparity::Error naming `kernel`):
// heads, GQA grouping, cache geometry, strides, scale, 16-byte aligned caches.
void require_attention_shapes(const char* kernel, const void* k_cache, const void* v_cache, int64_t num_heads, int64_t num_kv_heads,
                              int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq,
                              int64_t q_stride, int64_t out_stride, float scale);
// The key-chunk scheme's checks: chunk a positive multiple of the kernel's keys per block step,
// its block-table entries within the kernel's shared-memory table, max_chunks in [1, 65535], and
// the scratch given when the keys may split.
void require_attention_chunks(const char* kernel, int64_t chunk, int64_t keys_per_step,
                              int64_t block_size, int64_t max_table, int64_t max_chunks,
                              const float* partial_acc, const float* partial_ml,
                              const uint32_t* chunks_done);

void launch_kv_cache_write(const KvCacheWriteParams& p, cudaStream_t stream);
void launch_kv_cache_read(const KvCacheReadParams& p, cudaStream_t stream);
// head_dim a multiple of 32, at most 256.
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
