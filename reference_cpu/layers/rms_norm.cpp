#include "reference_cpu/layers/rms_norm.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace qparity::reference {

namespace {

void check_eps(double eps, const char* where) {
  if (!std::isfinite(eps) || eps < 0.0)
    throw Error(where, "eps " + std::to_string(eps) + " must be finite and >= 0");
}

// Normalizes in[0..n) into out[0..n) with weight w (and bias b when non-empty), in the order the
// header states.
void normalize_span(const double* in, double* out, int64_t n, std::span<const double> w,
                    std::span<const double> b, double eps) {
  double sum_sq = 0.0;
  for (int64_t j = 0; j < n; ++j)
    sum_sq += in[j] * in[j];
  const double variance = sum_sq / static_cast<double>(n);
  const double r = 1.0 / std::sqrt(variance + eps);
  for (int64_t j = 0; j < n; ++j) {
    const auto uj = static_cast<size_t>(j);
    double y = w[uj] * (in[j] * r);
    if (!b.empty()) y += b[uj];
    out[j] = y;
  }
}

}  // namespace

Matrix rms_norm(const Matrix& x, std::span<const double> weight, double eps,
                std::span<const double> bias) {
  if (x.cols <= 0) throw Error("rms_norm", "input has no columns (hidden size 0)");
  if (static_cast<int64_t>(weight.size()) != x.cols)
    throw Error("rms_norm", "weight has " + std::to_string(weight.size()) +
                                " elements, the input has hidden size " + std::to_string(x.cols));
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != x.cols)
    throw Error("rms_norm", "bias has " + std::to_string(bias.size()) +
                                " elements, the input has hidden size " + std::to_string(x.cols));
  check_eps(eps, "rms_norm");
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t)
    normalize_span(x.row(t).data(), y.row(t).data(), x.cols, weight, bias, eps);
  return y;
}

Matrix rms_norm_heads(const Matrix& x, int64_t head_dim, std::span<const double> weight,
                      double eps) {
  if (head_dim <= 0)
    throw Error("rms_norm_heads", "head_dim " + std::to_string(head_dim) + " must be > 0");
  if (x.cols <= 0 || x.cols % head_dim != 0)
    throw Error("rms_norm_heads", "input width " + std::to_string(x.cols) +
                                      " is not a positive multiple of head_dim " +
                                      std::to_string(head_dim));
  if (static_cast<int64_t>(weight.size()) != head_dim)
    throw Error("rms_norm_heads", "weight has " + std::to_string(weight.size()) +
                                      " elements, head_dim is " + std::to_string(head_dim));
  check_eps(eps, "rms_norm_heads");
  const int64_t heads = x.cols / head_dim;
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t h = 0; h < heads; ++h)
      normalize_span(x.row(t).data() + h * head_dim, y.row(t).data() + h * head_dim, head_dim,
                     weight, {}, eps);
  return y;
}

}  // namespace qparity::reference
