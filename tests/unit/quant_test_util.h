#pragma once
// Shared helpers for the quantization-scheme tests: realistic random weights and activations
// (per-channel scale spread, heavy tails, a few outlier input channels), and error norms.
#include <algorithm>
#include <cmath>
#include <random>

#include "schemes/math/matmul.h"

namespace qparity::test {

// Gaussian entries times a per-row scale spread over ~2 decades, with Student-t(3) tails and
// `outlier_cols` input columns amplified 20x (what makes per-group scales and smoothing matter).
inline Matrix realistic_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, double base = 0.02,
                               int outlier_cols = 2) {
  std::student_t_distribution<double> t3(3.0);
  std::uniform_real_distribution<double> spread(-1.0, 1.0);
  std::uniform_int_distribution<int64_t> col(0, cols - 1);
  std::vector<double> row_scale(static_cast<size_t>(rows));
  for (auto& s : row_scale)
    s = base * std::pow(10.0, spread(rng));
  std::vector<double> col_gain(static_cast<size_t>(cols), 1.0);
  for (int i = 0; i < outlier_cols && cols > 0; ++i)
    col_gain[static_cast<size_t>(col(rng))] = 20.0;
  Matrix m(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m(r, c) = t3(rng) * row_scale[static_cast<size_t>(r)] * col_gain[static_cast<size_t>(c)];
  return m;
}

inline Matrix gaussian_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, double sd = 1.0) {
  std::normal_distribution<double> g(0.0, sd);
  Matrix m(rows, cols);
  for (auto& v : m.data)
    v = g(rng);
  return m;
}

// ||a - b|| / ||b|| (Frobenius); 0 when both are zero.
inline double relative_l2(const Matrix& a, const Matrix& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    const double d = a.data[i] - b.data[i];
    num += d * d;
    den += b.data[i] * b.data[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

inline double max_abs_diff(const Matrix& a, const Matrix& b) {
  double m = 0;
  for (size_t i = 0; i < a.data.size(); ++i)
    m = std::max(m, std::fabs(a.data[i] - b.data[i]));
  return m;
}

}  // namespace qparity::test
