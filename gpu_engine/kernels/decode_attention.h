#pragma once
// Attention for decode-sized batches (a few tokens), with what runs between the qkv projection
// and attention fused in: one launch per layer instead of attention_prologue + paged_attention,
// and the KV cache streamed before the previous kernel has finished.
//
// Why: at batch 1 the pair costs ~15 us per layer inside a CUDA graph (bench_engine --ablate
// attention on an H100), almost all of it latency: a kernel boundary, then a chain of dependent
// reads (positions, block table, keys) after the wait. Here, before pdl_wait() (pdl.h), each warp
// reads the batch's positions and its own keys' block-table entries, requests its keys' K and V,
// and computes its RoPE angles - every cached key was written by an earlier forward, never by
// this one - with no block barrier on the way (measured with the stage stamps below, 0.6B at ~600
// positions on an H100: the shared-memory table and barriers this replaced made the median block
// reach its wait 1.3 us after the release; now it is there 0.1-0.5 us before). After the wait a
// block only reads the token's own q/k/v row, which the qkv GEMM just wrote.
//
// Semantics (the same function as attention_prologue.h followed by paged_attention.h):
//   q, k: Qwen3's per-head RMSNorm (q_norm / k_norm; skipped when null), fp32, rounded to bf16;
//   RoPE in fp64 (HF rotate-half, angles double(pos) * inv_freq, times rope_scaling), rounded to
//   bf16; the new K and V go to the paged cache (paged_attention.h's layout); then
//   softmax(q.k * scale) V over positions 0..pos of the token's sequence: fp32 dot products and
//   online softmax, fp32 accumulation, the output rounded once to bf16.
// A key at a position that some token of this batch holds (same sequence) is computed from that
// token's qkv row, never read from the cache (this launch writes it there); every other key
// comes from the cache. So a batch may hold several tokens of one sequence (a short prefill).
// Each token's K/V is written exactly once: by its own block at its last chunk, for the first q
// head of each KV group. With a quantized cache (kv_quant.h) the batch's keys and values are
// quantized there and used dequantized, by every block that reads them: each token attends to
// what the cache holds, the cached keys dequantized as they are loaded.
//
// Split keys: token i's positions are cut into chunks of `chunk` keys (a multiple of 64), one
// block per (token, head, chunk); chunk states merge in chunk order in the token's last block to
// finish (paged_attention.h's scheme). The cut depends only on the position: a token's result
// is bit-identical alone or batched, run to run. (Measured on an H100, 0.6B decode at ~600
// positions: 64-key chunks beat 128 by 6 %; one block per KV head serving its whole q-head group
// was 3 % slower overall than one block per q head.)
//
// The per-head norm sums squares in a different order from attention_prologue's (each lane holds
// head_dim/32 consecutive elements), so the two may differ in the last bit of the norm's fp32
// scale; everything else is the same arithmetic.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gpu_engine/kernels/kernel_probe.h"
#include "gpu_engine/kernels/kv_quant.h"

namespace qparity::gpu {

// Tokens per launch at most (the batch's positions are staged in shared memory).
constexpr int64_t kDecodeAttentionMaxTokens = 8;

struct DecodeAttentionParams {
  // Token i's raw [q heads | k heads | v heads] (the qkv GEMM's output) at qkv + i * qkv_stride.
  const __nv_bfloat16* qkv = nullptr;
  int64_t qkv_stride = 0;
  const __nv_bfloat16* q_norm = nullptr;  // [head_dim]; q_norm and k_norm both or neither
  const __nv_bfloat16* k_norm = nullptr;
  float eps = 1e-6f;
  // Zero-centred q/k norms (Qwen3.5: x̂ * (1 + w)): 1, added to the weight in fp32.
  float norm_offset = 0.f;
  const int32_t* positions = nullptr;  // [tokens]
  // Optional [tokens]: rotary positions where they are not the positions (a decode after an
  // image prompt: position + mrope_position_delta, the three M-RoPE rows equal). An image
  // prompt's own rows differ per frequency: attention_prologue takes those.
  const int32_t* rope_positions = nullptr;
  const int32_t* seq = nullptr;        // [tokens]
  const double* inv_freq = nullptr;    // [head_dim / 2]
  double rope_scaling = 1.0;
  void* k_cache = nullptr;  // elements of kv.format (kv_quant.h)
  void* v_cache = nullptr;
  KvQuant kv = {};
  const int32_t* block_table = nullptr;
  // Optional [tokens, max_blocks_per_seq]: token i's own copy of its sequence's block-table row,
  // uploaded with the batch. Read instead of block_table[seq[i]], it removes one dependent
  // memory round trip (seq, then the table) before the cached keys can be requested.
  const int32_t* token_table = nullptr;
  int64_t block_size = 0, max_blocks_per_seq = 0;
  __nv_bfloat16* out = nullptr;  // token i, head h at out + i * out_stride + h * head_dim
  int64_t out_stride = 0;
  // Optional capture outputs, [tokens, (num_heads + num_kv_heads) * head_dim] each: q and k after
  // the norm (before RoPE), and after RoPE.
  __nv_bfloat16* normed_out = nullptr;
  __nv_bfloat16* rope_out = nullptr;
  int64_t tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 0;  // 1/sqrt(head_dim) for Llama / Qwen3
  // The q/k norm's divisor: the head's own length when head_dim is zero-padded for the kernels
  // (shape_padding.h); 0 means head_dim. Padding adds zeros to the sum of squares, exactly.
  int64_t norm_dim = 0;
  // Positions must be < chunk * max_chunks (beyond, the token's output is NaN: keys are never
  // silently dropped). With max_chunks > 1 the scratch is required (paged_attention_scratch).
  int64_t chunk = 64, max_chunks = 1;
  float* partial_acc = nullptr;
  float* partial_ml = nullptr;
  uint32_t* chunks_done = nullptr;  // zero; each launch leaves it zero
  KernelProbe* probe = nullptr;     // optional timeline stamps (kernel_probe.h)
  // Optional (a diagnostic): decode_attention_stage_buffer(), to stamp where each block's time
  // goes; a separate instantiation of the kernel, so the plain one carries none of it (bf16
  // caches only).
  unsigned long long* stages = nullptr;
};

// Stage stamps (%globaltimer, ns) of token 0's blocks, kStageSlots a block at block index
// h * max_chunks + c, as the last stamped launch left them: 0 entry, 1 before the PDL wait,
// 2 released, 3 q normalized and rotated, 4 the softmax over its keys done, 5 the block's warps
// merged, 6 counted on the chunk counter (0 for a one-chunk token), 7 exit (after the merge for
// the token's last block), 8 the token's chunk count. Blocks past the token's chunks stamp
// nothing. Reset before a launch to tell stale blocks apart.
constexpr int kStageSlots = 9;
unsigned long long* decode_attention_stage_buffer();
void reset_decode_attention_stages();
std::vector<unsigned long long> read_decode_attention_stages(int64_t blocks);

// head_dim a multiple of 32 in [32, 256]; at most kDecodeAttentionMaxTokens tokens.
void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
