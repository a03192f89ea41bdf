#pragma once
// Qwen3-VL's multimodal rotary positions (transformers' Qwen3VLModel.get_rope_index and
// Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope; docs/research/qwen3_next_and_qwen3_vl.md
// §6.1-6.2), the building blocks of image prompts in the decoder (not wired into it yet).
//
// Positions: three rows (temporal, height, width) per token. Walking the prompt, each image's
// placeholder run (image_token_id, Σ t·(h/m)·(w/m) of them for its grid) is preceded by text:
//   text        s0 + [0, 1, ..., n_text − 1] on all three rows, s0 = 1 + the largest position so
//               far (0 at the start); the run's text includes its vision_start token
//   image       (t_idx, h_idx, w_idx) + s0 + n_text over the merged grid (t, h/m, w/m) in
//               row-major order (t_idx is 0 for an image)
//   trailing text continues from 1 + the largest position so far
//   delta       1 + the largest position − the prompt length: decode step c uses c + delta on all
//               three rows (mrope_position_delta)
// A prompt without images gets 0, 1, 2, ... on all rows (delta 0).
//
// Frequencies: with F = rotary_dim / 2 and sections (s_t, s_h, s_w), frequency i reads the row
//   height  if i % 3 == 1 and i < 3·s_h
//   width   if i % 3 == 2 and i < 3·s_w
//   time    otherwise
// (apply_interleaved_mrope's slices, which stop at F when a section is longer). Equal rows give
// the 1-D RoPE.
#include <cstdint>
#include <span>
#include <vector>

namespace qparity::reference {

struct MropePositions {
  std::vector<int64_t> t, h, w;  // one per token
  int64_t delta = 0;
};

struct GridThw {  // one image (t = 1) or video (t frames) in patches, as grid_thw
  int64_t t = 1, h = 0, w = 0;
};

// Throws naming the token index when an image's placeholder run is shorter or longer than its
// grid gives, when a placeholder run has no grid left, when a grid has no placeholder run, or
// (vision_start_token_id >= 0) when a run does not directly follow that token. transformers
// finds the runs in two ways (4.57: after each vision_start; 5.x: maximal runs of image-typed
// tokens); a prompt that opens every image with its vision_start token means the same to both.
MropePositions mrope_positions(std::span<const int64_t> tokens, int64_t image_token_id,
                               std::span<const GridThw> grids, int64_t merge,
                               int64_t vision_start_token_id = -1);

// The frequency rows: mrope_frequency_rows in core/config/rope_tables.h.

}  // namespace qparity::reference
