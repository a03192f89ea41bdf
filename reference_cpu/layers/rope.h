#pragma once
// Rotary position embedding exactly as HF computes it (rotate-half / NeoX convention), in fp64,
// and ChatGLM2's variant (interleaved pairs over the first half of each head).
//
// The inverse frequencies of each rope type: core/config/rope_tables.h.
//
// Angles and rotation (HF <Model>RotaryEmbedding.forward and apply_rotary_pos_emb):
//   freqs[i]    = double(pos) * inv_freq[i]                  (outer product: one rounding)
//   emb         = cat(freqs, freqs)                          (dim values)
//   cos[j]      = std::cos(emb[j]) * attention_scaling, sin likewise (libm, fp64)
//   out[j]      = x[j] * cos[j] + rotate_half(x)[j] * sin[j], rotate_half(x) = cat(-x2, x1)
//                 i.e. j <  dim/2: x[j] * cos[j] + (-x[j + dim/2]) * sin[j]
//                      j >= dim/2: x[j] * cos[j] + x[j - dim/2] * sin[j]
// Interleaved (ChatGLM2 apply_rotary_pos_emb, cfg.rope_interleaved): pair i is (x[2i], x[2i+1]),
//   out[2i]   = x[2i] * cos_i - x[2i+1] * sin_i
//   out[2i+1] = x[2i+1] * cos_i + x[2i] * sin_i
// (the same products and sums as rotate-half with the pair at (i, i + dim/2)). Dims from
// rotary_dim to head_dim pass through unchanged (ChatGLM2: cat(x_out, x_pass)).
// Every value is computed independently in the order written, so results do not depend on the
// thread count.
#include <cstdint>
#include <span>
#include <vector>

#include "core/config/model_config.h"
#include "core/config/rope_tables.h"
#include "reference_cpu/layers/mrope.h"
#include "schemes/math/matmul.h"

namespace qparity::reference {

class Rope {
 public:
  // Reads head_dim, rotary_dim (0: head_dim), rope_interleaved, rope_theta and rope_scaling.
  // Throws qparity::Error ("rope") for an odd or non-positive (rotary) dim, a
  // non-positive theta, an unsupported rope type (named), or a missing / invalid llama3 field.
  explicit Rope(const ModelConfig& config);

  // dim / 2 inverse frequencies, computed as the header states.
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  double attention_scaling() const { return attention_scaling_; }
  int64_t dim() const { return dim_; }  // the rotary dim
  int64_t head_dim() const { return head_dim_; }
  bool interleaved() const { return interleaved_; }

  // Rotates x [T, num_heads * head_dim] in place; row t uses positions[t]. Throws qparity::Error
  // ("rope apply") when x's shape and num_heads / positions disagree or a position is negative.
  void apply(Matrix& x, int64_t num_heads, std::span<const int64_t> positions) const;

  // cos / sin of length dim for one position (cat(freqs, freqs) layout, times attention_scaling).
  void cos_sin(int64_t pos, std::vector<double>& cos, std::vector<double>& sin) const;

  // Qwen3-VL's interleaved M-RoPE (mrope.h): frequency i of token t takes its angle from the row
  // rows[i] of `positions` (mrope_frequency_rows), each angle computed as cos_sin computes it, so
  // equal rows rotate exactly as apply does. Rotate-half only.
  void apply_mrope(Matrix& x, int64_t num_heads, const MropePositions& positions,
                   std::span<const int> rows) const;

 private:
  void rotate_row(double* row, int64_t num_heads, const std::vector<double>& cos,
                  const std::vector<double>& sin) const;
  int64_t dim_ = 0;
  int64_t head_dim_ = 0;
  bool interleaved_ = false;
  double attention_scaling_ = 1.0;
  std::vector<double> inv_freq_;
};

}  // namespace qparity::reference
