#pragma once
// Causal attention for prefill, tiled over queries: a block takes up to kPrefillTileRows rows of
// the batch that belong to one sequence (a tile) and one query head, stages each 32-key chunk of
// that sequence's K and V in shared memory once, and serves every row of the tile from it. Where
// paged_attention.h reads a sequence's keys once per token (a 512-token prefill re-reads them
// 512 times from L2), this reads them once per tile.
//
// Same cache layout, same semantics as launch_paged_attention: row i (sequence seq[i], position
// pos[i]) attends to positions 0..pos[i] of its sequence, GQA by head groups. Precision: q.k in
// fp32 from bf16 inputs (q pre-scaled by `scale` in fp32), online softmax in fp32, p.V
// accumulated in fp32, one rounding of the output to bf16. Keys run in ascending 32-key chunks;
// a row's order depends only on its position: deterministic, and independent of the other rows
// of its tile. (paged_attention.h sums in another order: the two agree within the rounding of
// the output.)
//
// Tiles: tiles[0] = how many, then per tile (first row, rows): rows consecutive in the batch, of
// one sequence, at most kPrefillTileRows (plan_prefill_tiles builds them from the batch's
// sequence ids). The grid covers max_tiles; blocks beyond the count exit, so a CUDA graph
// captured for one batch size replays for any tiling of that size.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace qparity::gpu {

constexpr int kPrefillTileRows = 16;

struct PrefillAttentionParams {
  const __nv_bfloat16* q = nullptr;  // row i, head h at q + i * q_stride + h * head_dim
  int64_t q_stride = 0;
  const __nv_bfloat16* k_cache = nullptr;
  const __nv_bfloat16* v_cache = nullptr;
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

// head_dim 64 or 128 (the shared-memory tiles are sized for them).
void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream);

}  // namespace qparity::gpu
