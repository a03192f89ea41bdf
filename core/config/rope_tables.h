#pragma once
// The rotary embedding's tables, computed once from the config in fp64: the inverse frequencies of
// each rope type and Qwen3-VL's M-RoPE frequency rows. Both engines build their rotations from
// these (the reference rotates in fp64, reference_cpu/layers/rope.h; the GPU engine uploads the
// tables), so the two cannot disagree about a frequency.
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
//   yarn     (_compute_yarn_parameters), pos_freq[i] = base ** ((2i) / dim):
//              correction(r) = (dim * ln(omax / (r * 2 * pi))) / (2 * ln(base))
//              low = correction(beta_fast), high = correction(beta_slow); with truncate (HF's
//              default true; gpt-oss writes false) floor(low), ceil(high); then low = max(low, 0),
//              high = min(high, dim - 1); high += 0.001 when they are equal
//              ramp[i]   = clamp((i - low) / (high - low), 0, 1);  ex = 1 - ramp[i]
//              inv_freq[i] = (1 / (factor * pos_freq)) * (1 - ex) + (1 / pos_freq) * ex
//            attention_scaling = attention_factor if given, else mscale / mscale_all_dim as
//            get_mscale(factor, m) = factor <= 1 ? 1 : 0.1 * m * ln(factor) + 1 when both are
//            non-zero, else get_mscale(factor, 1); it multiplies cos and sin (rope.h).
//   attention_scaling is 1.0 for default / linear / llama3 (HF's attention_factor for them).
// Other rope types (dynamic, longrope) throw a qparity::Error naming the type.
#include <cstdint>
#include <span>
#include <vector>

#include "core/config/model_config.h"

namespace qparity {

struct RopeTable {
  int64_t dim = 0;       // the rotary dim (rotary_dim, or head_dim)
  int64_t head_dim = 0;  // dims from dim to head_dim pass through
  bool interleaved = false;
  double attention_scaling = 1.0;
  std::vector<double> inv_freq;  // dim / 2 values
};

// Throws qparity::Error ("rope") for a rotary dim that is not positive, even and at most head_dim,
// a rope_theta that is not > 0, a bad scaling parameter, or a rope type it does not implement.
RopeTable rope_table(const ModelConfig& config);

// The default inverse frequencies 1.0 / (base ** (double(2i) / dim)), i = 0..dim/2-1.
std::vector<double> default_inv_freq(double base, int64_t dim);

// HF _compute_llama3_parameters applied to a default inv_freq, in the order the header states.
std::vector<double> llama3_inv_freq(const std::vector<double>& inv_freq, double factor,
                                    double low_freq_factor, double high_freq_factor,
                                    double old_context_len);

// HF _compute_yarn_parameters' inverse frequencies, in the order the header states.
std::vector<double> yarn_inv_freq(double base, int64_t dim, double factor, double beta_fast,
                                  double beta_slow, double original_max_position_embeddings,
                                  bool truncate);
// HF's YaRN attention_factor (the cos / sin multiplier) of a yarn rope_scaling.
double yarn_attention_factor(const RopeScaling& rs);

// Qwen3-VL's interleaved M-RoPE: the row (0 time, 1 height, 2 width) each of the `freqs`
// frequencies reads, with sections (s_t, s_h, s_w): height if i % 3 == 1 and i < 3·s_h, width if
// i % 3 == 2 and i < 3·s_w, time otherwise (apply_interleaved_mrope's slices).
std::vector<int> mrope_frequency_rows(int64_t freqs, std::span<const int64_t> sections);

}  // namespace qparity
