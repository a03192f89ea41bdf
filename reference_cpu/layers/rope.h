#pragma once
// Rotary position embedding exactly as HF computes it (rotate-half / NeoX convention), in fp64,
// and ChatGLM2's variant (interleaved pairs over the first half of each head).
//
// inv_freq (transformers src/transformers/modeling_rope_utils.py), dim = the rotary dim
// (cfg.rotary_dim: head_dim, or head_dim / 2 for ChatGLM2, whose RotaryEmbedding(dim) computes
// 1 / (base ** (arange(0, dim, 2) / dim)) the same way), i = 0..dim/2-1:
//   default  inv_freq[i] = 1.0 / (base ** ((2i) / dim))        base = rope_theta; the exponent is
//            the fp64 quotient double(2i) / double(dim), then std::pow, then a divide into 1.0
//            (HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), same three roundings)
//   linear   default, then inv_freq[i] / factor
//   llama3   (_compute_llama3_parameters) from the default inv_freq:
//              low_freq_wavelen  = old_context_len / low_freq_factor
//              high_freq_wavelen = old_context_len / high_freq_factor
//              wavelen           = (2 * pi) / inv_freq                (2*pi is exact: 2 * M_PI)
//              llama             = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq
//              smooth            = (old_context_len / wavelen - low_freq_factor)
//                                  / (high_freq_factor - low_freq_factor)
//              smoothed          = ((1 - smooth) * llama) / factor + smooth * llama
//              result            = !(wavelen < high) && !(wavelen > low) ? smoothed : llama
//   attention_scaling is 1.0 for all three (HF's attention_factor for these types).
// Other rope types (dynamic, yarn, longrope) throw a qparity::Error naming the type.
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
#include "reference_cpu/layers/mrope.h"
#include "reference_cpu/quant/matrix.h"

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

// The default inverse frequencies 1.0 / (base ** (double(2i) / dim)), i = 0..dim/2-1.
std::vector<double> default_inv_freq(double base, int64_t dim);

// HF _compute_llama3_parameters applied to a default inv_freq, in the order the header states.
std::vector<double> llama3_inv_freq(const std::vector<double>& inv_freq, double factor,
                                    double low_freq_factor, double high_freq_factor,
                                    double old_context_len);

}  // namespace qparity::reference
