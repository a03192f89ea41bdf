#include "reference_cpu/layers/rope.h"

#include <cmath>
#include <numbers>
#include <optional>
#include <string>

#include "core/error.h"

namespace qparity::reference {

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

namespace {

double require_llama3(const std::optional<double>& v, const char* name) {
  if (!v) throw Error("rope", std::string("llama3 rope needs ") + name);
  if (!std::isfinite(*v)) throw Error("rope", std::string("llama3 ") + name + " is not finite");
  return *v;
}

}  // namespace

Rope::Rope(const ModelConfig& config)
    : dim_(config.rotary_dim > 0 ? config.rotary_dim : config.head_dim),
      head_dim_(config.head_dim),
      interleaved_(config.rope_interleaved) {
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
    case RopeType::kDynamic:
    case RopeType::kYarn:
    case RopeType::kLongrope:
      throw Error("rope", "rope type '" + std::string(rope_type_name(rs.type)) +
                              "' is not supported by the reference (supported: default, linear, "
                              "llama3)");
  }
}

void Rope::cos_sin(int64_t pos, std::vector<double>& cos, std::vector<double>& sin) const {
  const size_t half = inv_freq_.size();
  cos.resize(2 * half);
  sin.resize(2 * half);
  for (size_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq_[i];
    const double c = std::cos(angle) * attention_scaling_;
    const double s = std::sin(angle) * attention_scaling_;
    cos[i] = c;
    cos[i + half] = c;
    sin[i] = s;
    sin[i + half] = s;
  }
}

void Rope::apply(Matrix& x, int64_t num_heads, std::span<const int64_t> positions) const {
  if (num_heads <= 0)
    throw Error("rope apply", "num_heads " + std::to_string(num_heads) + " must be > 0");
  if (x.cols != num_heads * head_dim_)
    throw Error("rope apply", "input width " + std::to_string(x.cols) + " != num_heads " +
                                  std::to_string(num_heads) + " * head_dim " +
                                  std::to_string(head_dim_));
  if (static_cast<int64_t>(positions.size()) != x.rows)
    throw Error("rope apply", std::to_string(positions.size()) + " positions for " +
                                  std::to_string(x.rows) + " rows");
  std::vector<double> cos, sin;
  for (int64_t t = 0; t < x.rows; ++t) {
    const int64_t pos = positions[static_cast<size_t>(t)];
    if (pos < 0)
      throw Error("rope apply",
                  "position " + std::to_string(pos) + " of row " + std::to_string(t) + " < 0");
    cos_sin(pos, cos, sin);
    rotate_row(x.row(t).data(), num_heads, cos, sin);
  }
}

void Rope::rotate_row(double* row, int64_t num_heads, const std::vector<double>& cos,
                      const std::vector<double>& sin) const {
  const int64_t half = dim_ / 2;
  std::vector<double> head(static_cast<size_t>(dim_));
  for (int64_t h = 0; h < num_heads; ++h) {
    double* xh = row + h * head_dim_;
    if (interleaved_) {
      for (int64_t i = 0; i < half; ++i) {
        const auto ui = static_cast<size_t>(i);
        const double x0 = xh[2 * i], x1 = xh[2 * i + 1];
        xh[2 * i] = x0 * cos[ui] - x1 * sin[ui];
        xh[2 * i + 1] = x1 * cos[ui] + x0 * sin[ui];
      }
      continue;
    }
    for (int64_t j = 0; j < dim_; ++j)
      head[static_cast<size_t>(j)] = xh[j];
    for (int64_t j = 0; j < dim_; ++j) {
      const auto uj = static_cast<size_t>(j);
      const double rotated =
          j < half ? -head[static_cast<size_t>(j + half)] : head[static_cast<size_t>(j - half)];
      xh[j] = head[uj] * cos[uj] + rotated * sin[uj];
    }
  }
}

void Rope::apply_mrope(Matrix& x, int64_t num_heads, const MropePositions& positions,
                       std::span<const int> rows) const {
  if (interleaved_) throw Error("rope apply", "M-RoPE is rotate-half; interleaved pairs refused");
  if (num_heads <= 0 || x.cols != num_heads * head_dim_)
    throw Error("rope apply", "input width " + std::to_string(x.cols) + " != num_heads " +
                                  std::to_string(num_heads) + " * head_dim " +
                                  std::to_string(head_dim_));
  const auto n = static_cast<size_t>(x.rows);
  if (positions.t.size() != n || positions.h.size() != n || positions.w.size() != n)
    throw Error("rope apply", "M-RoPE positions for " + std::to_string(positions.t.size()) +
                                  " tokens, " + std::to_string(n) + " rows");
  const size_t half = inv_freq_.size();
  if (rows.size() != half)
    throw Error("rope apply", std::to_string(rows.size()) + " frequency rows for " +
                                  std::to_string(half) + " frequencies");
  std::vector<double> cos(2 * half), sin(2 * half);
  std::vector<double> c3[3], s3[3];
  for (size_t t = 0; t < n; ++t) {
    const int64_t pos[3] = {positions.t[t], positions.h[t], positions.w[t]};
    for (int r = 0; r < 3; ++r) {
      if (pos[r] < 0)
        throw Error("rope apply",
                    "position " + std::to_string(pos[r]) + " of row " + std::to_string(t) + " < 0");
      cos_sin(pos[r], c3[r], s3[r]);
    }
    for (size_t i = 0; i < half; ++i) {
      const auto r = static_cast<size_t>(rows[i]);
      cos[i] = cos[i + half] = c3[r][i];
      sin[i] = sin[i + half] = s3[r][i];
    }
    rotate_row(x.row(static_cast<int64_t>(t)).data(), num_heads, cos, sin);
  }
}

}  // namespace qparity::reference
