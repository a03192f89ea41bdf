#pragma once
// Qwen3-VL's vision tower in fp64 (transformers' Qwen3VLVisionModel; the math with sources:
// docs/research/qwen3_next_and_qwen3_vl.md §5). Input: pixel patches [N, C·T·P·P] as the
// processor emits them (each row one temporal_patch × patch × patch patch in (C, T, P, P) order,
// rows in merge-window order: (t, h/m, w/m, m, m)) and each image's grid (t, h, w) in patches.
//
//   patch_embed  x = pixels · Wᵀ + b                     (the Conv3d with kernel = stride)
//   pos_embed    + the learned G×G table (G = √num_position_embeddings) bilinearly resampled to
//                h × w (align_corners: y_r = r·(G−1)/(h−1), torch.linspace in fp64; floor,
//                ceil clipped to G−1, weights (1−dy)(1−dx), (1−dy)dx, dy(1−dx), dy·dx summed in
//                that order), repeated over t, permuted into merge-window order
//   blocks ×D    h += proj(attn(LN1(h))); h += fc2(gelu_tanh(fc1(LN2(h))))
//                LN: LayerNorm eps 1e-6 (biased variance). attn: qkv rows [q | k | v] per head,
//                2-D RoPE: inv_freq_i = 1 / θ^(2i / (d/2)), i < d/4, θ = 10000; a patch at (row,
//                col) of its image rotates by [row·inv_freq | col·inv_freq] duplicated (rotate
//                half over the head dim d); softmax attention with scale d^−½, not causal, each
//                frame (h·w patches of one t) attending only within itself
//   merger       LN(h) per patch, 2×2 windows concatenated [N/4, 4h], fc1, GELU (erf), fc2
//   deepstack j  after block deepstack_visual_indexes[j]: windows concatenated, LN(4h), fc1,
//                GELU (erf), fc2 — the features added to the decoder's residual after layer j
//
// Precision: fp64 throughout (the producers keep the tower unquantized; transformers' casts to
// fp32 in the rotary and the position weights are lifted). Sums run in index order.
// Capture points: visual.embed (patch + position), visual.blocks.<i>.out, visual.merger,
// visual.deepstack.<j>.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/capture/trace.h"
#include "core/json_util.h"
#include "core/matrix.h"
#include "core/safetensors/checkpoint.h"
#include "reference_cpu/layers/mrope.h"

namespace qparity::reference {

struct VisionConfig {
  int64_t depth = 0, hidden = 0, heads = 0, intermediate = 0, out_hidden = 0;
  int64_t patch = 0, temporal_patch = 0, merge = 0, in_channels = 0, num_positions = 0;
  std::vector<int64_t> deepstack_indexes;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden / heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch * patch * patch; }
  int64_t grid_side() const;  // √num_positions
};

// config.json's vision_config (Qwen3VLVisionConfig); errors name the key. hidden_act must be
// gelu_pytorch_tanh, the table square, the head dim divisible by 4, the deepstack taps blocks.
VisionConfig parse_vision_config(const Json& vc, const std::string& where);

// GridThw (reference_cpu/layers/mrope.h): one image or video in patches; h and w multiples of
// the merge size.

struct VisionOutput {
  Matrix merged;                  // [N / m², out_hidden]: the image tokens' embeddings
  std::vector<Matrix> deepstack;  // one [N / m², out_hidden] per tap
};

// The position table resampled to each grid, in merge-window row order [Σ t·h·w, hidden].
Matrix vision_position_embedding(const Matrix& table, int64_t side, std::span<const GridThw> grids,
                                 int64_t merge);
// Each patch's (row, col) in its image, in merge-window order, frames repeated.
std::vector<std::pair<int64_t, int64_t>> vision_patch_coordinates(std::span<const GridThw> grids,
                                                                  int64_t merge);
// LayerNorm over each row: (x − mean) / √(var + eps) · w + b, var the biased mean of squares of
// the deviations.
Matrix layer_norm(const Matrix& x, std::span<const double> w, std::span<const double> b,
                  double eps);

class Qwen3VlVisionTower {
 public:
  // Reads model.visual.* from `ck` (canonical names: language_model_view leaves them as they are),
  // checking every shape against `cfg` and every value finite.
  Qwen3VlVisionTower(VisionConfig cfg, const Checkpoint& ck);

  const VisionConfig& config() const { return cfg_; }
  // Throws naming the rule when pixels' width, the grids' sizes or the row count disagree.
  VisionOutput forward(const Matrix& pixels, std::span<const GridThw> grids,
                       Trace* trace = nullptr) const;

 private:
  struct Linear {
    Matrix w;  // [out, in]
    std::vector<double> b;
  };
  struct Norm {
    std::vector<double> w, b;
  };
  struct Block {
    Norm norm1, norm2;
    Linear qkv, proj, fc1, fc2;
  };
  struct Merger {
    Norm norm;
    Linear fc1, fc2;
  };
  VisionConfig cfg_;
  Linear patch_embed_;
  Matrix pos_table_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
};

}  // namespace qparity::reference
