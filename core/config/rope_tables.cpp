#include "core/config/rope_tables.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include "core/error.h"

namespace qparity {

std::vector<double> default_inv_freq(double base, int64_t dim) {
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double exponent = static_cast<double>(2 * i) / static_cast<double>(dim);
    inv[static_cast<size_t>(i)] = 1.0 / std::pow(base, exponent);
  }
  return inv;
}

std::vector<double> llama3_inv_freq(const std::vector<double>& inv_freq, double factor,
                                    double low_freq_factor, double high_freq_factor,
                                    double old_context_len) {
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  const double two_pi = 2.0 * std::numbers::pi;  // Python's 2 * math.pi: exact doubling
  std::vector<double> out(inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double f = inv_freq[i];
    const double wavelen = two_pi / f;
    const double llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth =
        (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
    const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out[i] = is_medium ? smoothed : llama;
  }
  return out;
}

std::vector<double> yarn_inv_freq(double base, int64_t dim, double factor, double beta_fast,
                                  double beta_slow, double original_max_position_embeddings,
                                  bool truncate) {
  const double pi = std::numbers::pi;
  // find_correction_dim: (dim * ln(omax / (rotations * 2 * pi))) / (2 * ln(base))
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) *
            std::log(original_max_position_embeddings / (rotations * 2.0 * pi))) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's guard against a zero-width ramp
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, static_cast<double>(2 * i) / static_cast<double>(dim));
    const double extrapolation = 1.0 / pos_freq;
    const double interpolation = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    inv[static_cast<size_t>(i)] =
        interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

double yarn_attention_factor(const RopeScaling& rs) {
  if (rs.attention_factor) return *rs.attention_factor;
  auto mscale_of = [](double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  // Python truthiness: an mscale of 0 counts as absent.
  if (rs.mscale && *rs.mscale != 0.0 && rs.mscale_all_dim && *rs.mscale_all_dim != 0.0)
    return mscale_of(rs.factor, *rs.mscale) / mscale_of(rs.factor, *rs.mscale_all_dim);
  return mscale_of(rs.factor, 1.0);
}

namespace {

double require_llama3(const std::optional<double>& v, const char* name) {
  if (!v) throw Error("rope", std::string("llama3 rope needs ") + name);
  if (!std::isfinite(*v)) throw Error("rope", std::string("llama3 ") + name + " is not finite");
  return *v;
}

}  // namespace

RopeTable rope_table(const ModelConfig& config) {
  RopeTable t;
  t.dim = config.rotary_dim > 0 ? config.rotary_dim : config.head_dim;
  t.head_dim = config.head_dim;
  t.interleaved = config.rope_interleaved;
  const int64_t dim_ = t.dim, head_dim_ = t.head_dim;
  std::vector<double>& inv_freq_ = t.inv_freq;
  if (dim_ <= 0 || dim_ % 2 != 0 || dim_ > head_dim_)
    throw Error("rope", "rotary dim " + std::to_string(dim_) +
                            " must be positive, even and at most head_dim " +
                            std::to_string(head_dim_));
  if (!std::isfinite(config.rope_theta) || !(config.rope_theta > 0.0))
    throw Error("rope", "rope_theta " + std::to_string(config.rope_theta) + " must be > 0");
  const RopeScaling& rs = config.rope_scaling;
  inv_freq_ = default_inv_freq(config.rope_theta, dim_);
  switch (rs.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear: {
      if (!std::isfinite(rs.factor) || !(rs.factor > 0.0))
        throw Error("rope", "linear rope factor " + std::to_string(rs.factor) + " must be > 0");
      for (double& f : inv_freq_)
        f /= rs.factor;
      break;
    }
    case RopeType::kLlama3: {
      if (!std::isfinite(rs.factor) || !(rs.factor > 0.0))
        throw Error("rope", "llama3 rope factor " + std::to_string(rs.factor) + " must be > 0");
      const double low = require_llama3(rs.low_freq_factor, "low_freq_factor");
      const double high = require_llama3(rs.high_freq_factor, "high_freq_factor");
      if (!rs.original_max_position_embeddings)
        throw Error("rope", "llama3 rope needs original_max_position_embeddings");
      if (!(high > low) || !(low > 0.0))
        throw Error("rope", "llama3 rope needs 0 < low_freq_factor < high_freq_factor (got " +
                                std::to_string(low) + ", " + std::to_string(high) + ")");
      inv_freq_ = llama3_inv_freq(inv_freq_, rs.factor, low, high,
                                  static_cast<double>(*rs.original_max_position_embeddings));
      break;
    }
    case RopeType::kYarn: {
      if (!std::isfinite(rs.factor) || !(rs.factor > 0.0))
        throw Error("rope", "yarn rope factor " + std::to_string(rs.factor) + " must be > 0");
      if (!rs.original_max_position_embeddings)
        throw Error("rope", "yarn rope needs original_max_position_embeddings");
      // HF: `beta_fast or 32`, `beta_slow or 1` (a 0 counts as absent).
      const double fast = rs.beta_fast && *rs.beta_fast != 0.0 ? *rs.beta_fast : 32.0;
      const double slow = rs.beta_slow && *rs.beta_slow != 0.0 ? *rs.beta_slow : 1.0;
      if (!std::isfinite(fast) || !std::isfinite(slow) || !(fast > 0.0) || !(slow > 0.0))
        throw Error("rope", "yarn rope needs beta_fast and beta_slow > 0");
      inv_freq_ = yarn_inv_freq(config.rope_theta, dim_, rs.factor, fast, slow,
                                static_cast<double>(*rs.original_max_position_embeddings),
                                rs.truncate.value_or(true));
      t.attention_scaling = yarn_attention_factor(rs);
      if (!std::isfinite(t.attention_scaling) || !(t.attention_scaling > 0.0))
        throw Error("rope", "yarn attention factor " + std::to_string(t.attention_scaling) +
                                " must be > 0");
      break;
    }
    case RopeType::kDynamic:
    case RopeType::kLongrope:
      throw Error("rope", "rope type '" + std::string(rope_type_name(rs.type)) +
                              "' is not supported by the reference (supported: default, linear, "
                              "llama3, yarn)");
  }
  return t;
}

std::vector<int> mrope_frequency_rows(int64_t freqs, std::span<const int64_t> sections) {
  if (sections.size() != 3) throw Error("mrope_section", "needs 3 sections (t, h, w)");
  std::vector<int> rows(static_cast<size_t>(freqs), 0);
  for (int64_t i = 0; i < freqs; ++i) {
    if (i % 3 == 1 && i < 3 * sections[1]) rows[static_cast<size_t>(i)] = 1;
    if (i % 3 == 2 && i < 3 * sections[2]) rows[static_cast<size_t>(i)] = 2;
  }
  return rows;
}

}  // namespace qparity
