#include "reference_cpu/models/deviant_arithmetic.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "schemes/math/scaled_gemm.h"

namespace qparity::reference {

std::optional<Matrix> accumulate_linear(const LinearMethod& m, const Matrix& x, Arith acc,
                                        int64_t expert) {
  if (!m.config().transforms.empty()) return std::nullopt;
  const std::optional<QuantizedMatrix> codes = m.quantize_input(x, expert);
  const Matrix xin = codes ? dequantize(*codes) : x;
  const Matrix w = m.dequantized_weight(expert);  // [N, K]
  Matrix y = m.apply(x, expert);
  if (xin.cols != w.cols || y.cols != w.rows || y.rows != xin.rows)
    throw Error("accumulate_linear", m.shape().prefix + ": operand shapes disagree");
  for (int64_t t = 0; t < xin.rows; ++t) {
    const double* xr = xin.row(t).data();
    for (int64_t n = 0; n < w.rows; ++n) {
      const double* wr = w.row(n).data();
      double exact = 0.0, alt = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) {
        exact += xr[k] * wr[k];
        alt = in(acc, alt + in(acc, xr[k] * wr[k]));
      }
      y(t, n) += alt - exact;  // y - exact: what the method adds beyond its product (a bias)
    }
  }
  return y;
}

namespace {

// Row t of an RMSNorm's output from its 1 / rms r: y_j = round(w_j * round(x_j * r)), then
// + b_j rounded (both deviant norms end so).
void scale_row(const Matrix& x, int64_t t, double r, std::span<const double> weight,
               std::span<const double> bias, Arith a, Matrix& y) {
  for (int64_t j = 0; j < x.cols; ++j) {
    double v = in(a, weight[static_cast<size_t>(j)] * in(a, x(t, j) * r));
    if (!bias.empty()) v = in(a, v + bias[static_cast<size_t>(j)]);
    y(t, j) = v;
  }
}

}  // namespace

Matrix rms_norm_in(const Matrix& x, std::span<const double> weight, double eps,
                   std::span<const double> bias, Arith a) {
  if (static_cast<int64_t>(weight.size()) != x.cols)
    throw Error("rms_norm_in", "weight size differs from the row width");
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    double sum = 0.0;
    for (int64_t j = 0; j < x.cols; ++j)
      sum = in(a, sum + in(a, x(t, j) * x(t, j)));
    const double var = in(a, sum / static_cast<double>(x.cols));
    scale_row(x, t, in(a, 1.0 / in(a, std::sqrt(in(a, var + eps)))), weight, bias, a, y);
  }
  return y;
}

Matrix rms_norm_two_roundings(const Matrix& x, std::span<const double> weight, double eps,
                              std::span<const double> bias, Arith a) {
  if (static_cast<int64_t>(weight.size()) != x.cols)
    throw Error("rms_norm_two_roundings", "weight size differs from the row width");
  Matrix y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    double sum = 0.0;
    for (int64_t j = 0; j < x.cols; ++j)
      sum += x(t, j) * x(t, j);
    scale_row(x, t, 1.0 / std::sqrt(sum / static_cast<double>(x.cols) + eps), weight, bias, a, y);
  }
  return y;
}

namespace {

void check_rows(const char* where, const Matrix& x, int64_t num_heads, const Rope& rope,
                std::span<const int64_t> positions) {
  if (x.cols != num_heads * rope.head_dim() || static_cast<size_t>(x.rows) != positions.size())
    throw Error(where, "x, heads and positions disagree");
}

}  // namespace

void rotate_half_in(const Rope& rope, Matrix& x, int64_t num_heads,
                    std::span<const int64_t> positions, Arith a) {
  check_rows("rotate_half_in", x, num_heads, rope, positions);
  if (rope.interleaved()) throw Error("rotate_half_in", "an interleaved-rotary model");
  const int64_t dim = rope.dim(), hd = rope.head_dim(), half = dim / 2;
  std::vector<double> cos, sin, in_row(static_cast<size_t>(dim));
  for (int64_t t = 0; t < x.rows; ++t) {
    rope.cos_sin(positions[static_cast<size_t>(t)], cos, sin);
    for (double& c : cos)
      c = in(a, c);
    for (double& s : sin)
      s = in(a, s);
    for (int64_t h = 0; h < num_heads; ++h) {
      double* r = x.row(t).data() + h * hd;
      std::copy_n(r, dim, in_row.begin());
      for (int64_t j = 0; j < dim; ++j) {
        const double rot = j < half ? -in_row[static_cast<size_t>(j + half)]
                                    : in_row[static_cast<size_t>(j - half)];
        r[j] = in(a, in(a, in_row[static_cast<size_t>(j)] * cos[static_cast<size_t>(j)]) +
                         in(a, rot * sin[static_cast<size_t>(j)]));
      }
    }
  }
}

void rotate_pairs_interleaved(const Rope& rope, Matrix& x, int64_t num_heads,
                              std::span<const int64_t> positions) {
  check_rows("rotate_pairs_interleaved", x, num_heads, rope, positions);
  const int64_t dim = rope.dim(), hd = rope.head_dim();
  std::vector<double> cos, sin;
  for (int64_t t = 0; t < x.rows; ++t) {
    rope.cos_sin(positions[static_cast<size_t>(t)], cos, sin);
    for (int64_t h = 0; h < num_heads; ++h) {
      double* r = x.row(t).data() + h * hd;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const double x0 = r[2 * i], x1 = r[2 * i + 1];
        const double c = cos[static_cast<size_t>(i)], s = sin[static_cast<size_t>(i)];
        r[2 * i] = x0 * c - x1 * s;
        r[2 * i + 1] = x1 * c + x0 * s;
      }
    }
  }
}

Matrix attention_variant(const Matrix& q, const Matrix& k, const Matrix& v,
                         std::span<const int64_t> q_positions,
                         std::span<const int64_t> kv_positions, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double scaling, bool without_max,
                         bool round_probs, Arith a) {
  if (q.cols != num_heads * head_dim || k.cols != num_kv_heads * head_dim || k.rows != v.rows ||
      static_cast<int64_t>(q_positions.size()) != q.rows ||
      static_cast<int64_t>(kv_positions.size()) != k.rows || num_heads % num_kv_heads != 0)
    throw Error("attention_variant", "q, k, v, heads and positions disagree");
  const int64_t group = num_heads / num_kv_heads;
  Matrix out(q.rows, q.cols);
  std::vector<double> p;
  std::vector<int64_t> visible;
  for (int64_t t = 0; t < q.rows; ++t) {
    visible.clear();
    for (int64_t s = 0; s < k.rows; ++s)
      if (kv_positions[static_cast<size_t>(s)] <= q_positions[static_cast<size_t>(t)])
        visible.push_back(s);
    if (visible.empty()) throw Error("attention_variant", "a query sees no key");
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kvh = h / group;
      const double* qh = q.row(t).data() + h * head_dim;
      p.assign(visible.size(), 0.0);
      double m = -INFINITY;
      for (size_t i = 0; i < visible.size(); ++i) {
        const double* ks = k.row(visible[i]).data() + kvh * head_dim;
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d)
          dot += qh[d] * ks[d];
        p[i] = dot * scaling;
        m = std::max(m, p[i]);
      }
      if (without_max) {
        float z = 0.0f;
        for (double& e : p) {
          e = std::exp(static_cast<float>(e));
          z += static_cast<float>(e);
        }
        for (double& e : p)
          e = static_cast<float>(e) / z;
      } else {
        double z = 0.0;
        for (double& e : p) {
          e = std::exp(e - m);
          z += e;
        }
        for (double& e : p)
          e /= z;
      }
      if (round_probs)
        for (double& e : p)
          e = in(a, e);
      double* oh = out.row(t).data() + h * head_dim;
      for (size_t i = 0; i < visible.size(); ++i) {
        const double* vs = v.row(visible[i]).data() + kvh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d)
          oh[d] = oh[d] + p[i] * vs[d];
      }
    }
  }
  return out;
}

}  // namespace qparity::reference
