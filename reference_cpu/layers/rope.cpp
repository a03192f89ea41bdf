#include "reference_cpu/layers/rope.h"

#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"

namespace qparity::reference {

Rope::Rope(const ModelConfig& config) {
  RopeTable t = rope_table(config);
  dim_ = t.dim;
  head_dim_ = t.head_dim;
  interleaved_ = t.interleaved;
  attention_scaling_ = t.attention_scaling;
  inv_freq_ = std::move(t.inv_freq);
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
