#pragma once
// Causal attention for prefill, tiled over queries, on tensor cores: a block takes up to
// kPrefillTileRows (16: one m16 row block) rows of the batch that belong to one sequence (a tile)
// and the query heads of one KV head (up to 4, a warp each), stages each 32-key chunk of that
// sequence's K and V in shared memory once, and serves every row and head of the block from it.
//
// Same cache layout, same semantics as launch_paged_attention: row i (sequence seq[i], position
// pos[i]) attends to positions 0..pos[i] of its sequence, GQA by head groups. Precision: q.k on
// bf16 tensor cores (exact products, fp32 accumulation), then scaled by `scale` in fp32; online
// softmax in fp32; P.V on tf32 tensor cores with each fp32 probability split into two tf32
// terms (hi + lo: ~2^-22 relative, V exact in tf32), fp32 accumulation; one rounding of the
// output to bf16. (One tf32 rounding of P, 2^-11, measured 2-3x the layer-local error of the
// points after attention: a bf16 output flip for every few thousandths of relative error.) Keys run
// in ascending 32-key chunks; a row's order depends only on its position: deterministic, and
// independent of the other rows of its tile. (paged_attention.h keeps fp32 probabilities and sums
// in another order: the two agree within the rounding of the output.) Measured on an H100
// (bench_engine, Llama-3-8B shape, 4 x 512 tokens): the CUDA-core kernel this replaces took ~17 ms
// of a 66 ms prefill.
//
// Tiles: tiles[0] = how many, then per tile (first row, rows): rows consecutive in the batch, of
// one sequence, at most kPrefillTileRows (plan_prefill_tiles builds them from the batch's
// sequence ids). The grid covers max_tiles; blocks beyond the count exit, so a CUDA graph
// captured for one batch size replays for any tiling of that size.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_engine/kernels/kv_quant.h"
#include <vector>

namespace qparity::gpu {

constexpr int kPrefillTileRows = 16;

struct PrefillAttentionParams {
  const __nv_bfloat16* q = nullptr;  // row i, head h at q + i * q_stride + h * head_dim
  int64_t q_stride = 0;
  // Elements of kv.format (kv_quant.h); a quantized cache only where its read is bf16
  // (kv.read_bf16): the products take bf16 operands.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KvQuant kv = {};
  const int32_t* block_table = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* tiles = nullptr;  // [1 + 2 * max_tiles]
  int64_t max_tiles = 0;
  __nv_bfloat16* out = nullptr;  // row i, head h at out + i * out_stride + h * head_dim
  int64_t out_stride = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0;
  float scale = 0;
};

// Tiles over rows [0, seq.size()): maximal runs of one sequence id, cut every kPrefillTileRows.
// Returns [count, first0, rows0, first1, rows1, ...].
std::vector<int32_t> plan_prefill_tiles(const std::vector<int32_t>& seq);

// head_dim 64 or 128 (the shared-memory tiles are sized for them); q and out rows 4-byte aligned.
void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
