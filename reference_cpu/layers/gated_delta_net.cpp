#include "reference_cpu/layers/gated_delta_net.h"

#include <cmath>

#include "core/error.h"
#include "reference_cpu/layers/activation.h"

namespace qparity::reference {

namespace {

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

void require_shape(const Matrix& m, int64_t rows, int64_t cols, const char* what) {
  if (m.rows != rows || m.cols != cols)
    throw Error("gated_delta_net", std::string(what) + " is [" + std::to_string(m.rows) + ", " +
                                       std::to_string(m.cols) + "], expected [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

double softplus(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}

// x * (1 / sqrt(sum x^2 + 1e-6)) over n values, in place.
void l2_normalize(double* x, int64_t n) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i)
    ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss + 1e-6);
  for (int64_t i = 0; i < n; ++i)
    x[i] *= inv;
}

}  // namespace

void GatedDeltaNetState::reset(const LinearAttentionDims& d) {
  conv_inputs = Matrix(d.conv_kernel - 1, d.conv_dim());
  s.assign(at(d.state_size()), 0.0);
}

Matrix causal_conv_silu(const Matrix& x, const GatedDeltaNetParams& p, GatedDeltaNetState& st) {
  const int64_t c = p.dims.conv_dim(), k = p.dims.conv_kernel, t_count = x.rows;
  require_shape(x, t_count, c, "the conv input");
  if (st.empty()) st.reset(p.dims);
  // The window: the K - 1 cached rows, then this call's rows.
  const int64_t hist = k - 1;
  auto row = [&](int64_t u) -> const double* {  // u in [0, hist + T)
    return u < hist ? &st.conv_inputs.data[at(u * c)] : &x.data[at((u - hist) * c)];
  };
  Matrix out(t_count, c);
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t ch = 0; ch < c; ++ch) {
      double acc = 0.0;
      for (int64_t s = 0; s < k; ++s)
        acc += p.conv[at(ch * k + s)] * row(t + s)[ch];
      out(t, ch) = silu(acc);
    }
  // Keep the last K - 1 pre-conv rows.
  Matrix next(hist, c);
  for (int64_t i = 0; i < hist; ++i) {
    const double* src = row(t_count + i);
    std::copy_n(src, c, &next.data[at(i * c)]);
  }
  st.conv_inputs = std::move(next);
  return out;
}

void delta_rule_gates(const Matrix& b, const Matrix& a, const GatedDeltaNetParams& p, Matrix& beta,
                      Matrix& g) {
  const int64_t hv = p.dims.num_value_heads;
  require_shape(b, b.rows, hv, "b");
  require_shape(a, b.rows, hv, "a");
  beta = Matrix(b.rows, hv);
  g = Matrix(b.rows, hv);
  for (int64_t t = 0; t < b.rows; ++t)
    for (int64_t j = 0; j < hv; ++j) {
      beta(t, j) = 1.0 / (1.0 + std::exp(-b(t, j)));
      g(t, j) = -std::exp(p.a_log[at(j)]) * softplus(a(t, j) + p.dt_bias[at(j)]);
    }
}

Matrix gated_delta_rule(const Matrix& conv, const Matrix& beta, const Matrix& g,
                        const GatedDeltaNetParams& p, GatedDeltaNetState& st, bool fp32_state,
                        Matrix* states) {
  const LinearAttentionDims& d = p.dims;
  const int64_t t_count = conv.rows, hk = d.num_key_heads, hv = d.num_value_heads;
  const int64_t dk = d.key_head_dim, dv = d.value_head_dim, r = hv / hk;
  require_shape(conv, t_count, d.conv_dim(), "the conv output");
  require_shape(beta, t_count, hv, "beta");
  require_shape(g, t_count, hv, "g");
  if (st.empty()) st.reset(d);
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(dk));
  Matrix o(t_count, d.value_dim());
  if (states) *states = Matrix(t_count, d.state_size());
  std::vector<double> q(at(d.key_dim())), k(at(d.key_dim())), u(at(dv)), delta(at(dv));
  for (int64_t t = 0; t < t_count; ++t) {
    const double* row = &conv.data[at(t * conv.cols)];
    std::copy_n(row, d.key_dim(), q.begin());
    std::copy_n(row + d.key_dim(), d.key_dim(), k.begin());
    const double* v = row + 2 * d.key_dim();
    for (int64_t h = 0; h < hk; ++h) {
      l2_normalize(&q[at(h * dk)], dk);
      l2_normalize(&k[at(h * dk)], dk);
      for (int64_t i = 0; i < dk; ++i)
        q[at(h * dk + i)] *= q_scale;
    }
    for (int64_t j = 0; j < hv; ++j) {
      const double* kh = &k[at((j / r) * dk)];
      const double* qh = &q[at((j / r) * dk)];
      double* s = &st.s[at(j * dk * dv)];
      const double decay = std::exp(g(t, j));
      for (int64_t i = 0; i < dk * dv; ++i)
        s[i] *= decay;
      std::fill(u.begin(), u.end(), 0.0);
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e)
          u[at(e)] += s[x * dv + e] * kh[x];
      for (int64_t e = 0; e < dv; ++e)
        delta[at(e)] = (v[j * dv + e] - u[at(e)]) * beta(t, j);
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e)
          s[x * dv + e] += kh[x] * delta[at(e)];
      if (fp32_state)
        for (int64_t i = 0; i < dk * dv; ++i)
          s[i] = static_cast<double>(static_cast<float>(s[i]));
      for (int64_t x = 0; x < dk; ++x)
        for (int64_t e = 0; e < dv; ++e)
          o(t, j * dv + e) += s[x * dv + e] * qh[x];
    }
    if (states) std::copy(st.s.begin(), st.s.end(), &states->data[at(t * states->cols)]);
  }
  return o;
}

Matrix gated_rms_norm(const Matrix& o, const Matrix& z, const GatedDeltaNetParams& p) {
  const int64_t hv = p.dims.num_value_heads, dv = p.dims.value_head_dim;
  require_shape(o, o.rows, hv * dv, "the delta rule's output");
  require_shape(z, o.rows, hv * dv, "z");
  if (static_cast<int64_t>(p.norm.size()) != dv)
    throw Error("gated_delta_net", "norm weight of " + std::to_string(p.norm.size()) +
                                       " values for value heads of " + std::to_string(dv));
  Matrix y(o.rows, o.cols);
  for (int64_t t = 0; t < o.rows; ++t)
    for (int64_t j = 0; j < hv; ++j) {
      double ss = 0.0;
      for (int64_t e = 0; e < dv; ++e)
        ss += o(t, j * dv + e) * o(t, j * dv + e);
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(dv) + p.eps);
      for (int64_t e = 0; e < dv; ++e) {
        const int64_t c = j * dv + e;
        y(t, c) = (p.norm[at(e)] * (o(t, c) * rstd)) * silu(z(t, c));
      }
    }
  return y;
}

}  // namespace qparity::reference
