// Qwen3.5's Gated DeltaNet in the reference (reference_cpu/layers/gated_delta_net.h): the causal
// conv, the gates and the gated norm against hand-worked values; the sequential delta rule
// against the chunked (WY / UT-transform) form transformers' prefill runs, written here from its
// algorithm (torch_chunk_gated_delta_rule); prefill against token-by-token decode.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/error.h"
#include "reference_cpu/layers/activation.h"
#include "reference_cpu/layers/gated_delta_net.h"
#include "test_seed.h"

namespace qparity::test {
namespace {

using reference::GatedDeltaNetParams;
using reference::GatedDeltaNetState;

size_t at(int64_t i) {
  return static_cast<size_t>(i);
}

GatedDeltaNetParams params(int64_t hk, int64_t hv, int64_t dk, int64_t dv, int64_t k,
                           std::mt19937_64& rng) {
  GatedDeltaNetParams p;
  p.dims = {k, dk, dv, hk, hv};
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  p.conv.resize(at(p.dims.conv_dim() * k));
  for (double& x : p.conv)
    x = 0.5 * u(rng);
  for (int64_t j = 0; j < hv; ++j) {
    p.a_log.push_back(std::log(0.05 + std::abs(u(rng))));
    p.dt_bias.push_back(u(rng) - 1.0);
  }
  for (int64_t e = 0; e < dv; ++e)
    p.norm.push_back(1.0 + 0.1 * u(rng));
  p.eps = 1e-6;
  return p;
}

Matrix random_matrix(int64_t rows, int64_t cols, double scale, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, scale);
  Matrix m(rows, cols);
  for (double& x : m.data)
    x = n(rng);
  return m;
}

Matrix row_range(const Matrix& m, int64_t begin, int64_t end) {
  Matrix out(end - begin, m.cols);
  std::copy(m.data.begin() + begin * m.cols, m.data.begin() + end * m.cols, out.data.begin());
  return out;
}

double rel_l2(const Matrix& a, const Matrix& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    num += (a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
    den += b.data[i] * b.data[i];
  }
  return std::sqrt(num / den);
}

// transformers' torch_chunk_gated_delta_rule for one value head, in fp64: the chunk's UT system
// (I + strictly_lower((beta k) k^T * exp(G_i - G_j)))^{-1} by forward substitution, the new
// values and decayed keys, then the scan over chunks. q, k: [T, dk] normalized (q scaled);
// v: [T, dv]; returns o [T, dv] and leaves the final state in s [dk * dv].
std::vector<double> chunked_head(const std::vector<std::vector<double>>& q,
                                 const std::vector<std::vector<double>>& k,
                                 const std::vector<std::vector<double>>& v,
                                 const std::vector<double>& beta, const std::vector<double>& g,
                                 int64_t chunk, std::vector<double>& s) {
  const int64_t t_count = static_cast<int64_t>(q.size());
  const int64_t dk = static_cast<int64_t>(q[0].size()), dv = static_cast<int64_t>(v[0].size());
  std::vector<double> o(at(t_count * dv), 0.0);
  for (int64_t c0 = 0; c0 < t_count; c0 += chunk) {
    const int64_t n = chunk;  // padded: rows past T have g = 0, beta = 0, q = k = v = 0
    auto valid = [&](int64_t i) { return c0 + i < t_count; };
    std::vector<double> cum(at(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      cum[at(i)] = (i ? cum[at(i - 1)] : 0.0) + (valid(i) ? g[at(c0 + i)] : 0.0);
    auto kv = [&](int64_t i, int64_t d) { return valid(i) ? k[at(c0 + i)][at(d)] : 0.0; };
    auto qv = [&](int64_t i, int64_t d) { return valid(i) ? q[at(c0 + i)][at(d)] : 0.0; };
    auto vv = [&](int64_t i, int64_t e) { return valid(i) ? v[at(c0 + i)][at(e)] : 0.0; };
    auto bv = [&](int64_t i) { return valid(i) ? beta[at(c0 + i)] : 0.0; };
    // L[i][j], i > j: (beta_i k_i . k_j) exp(G_i - G_j)
    std::vector<std::vector<double>> lower(at(n), std::vector<double>(at(n), 0.0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dk; ++d)
          dot += bv(i) * kv(i, d) * kv(j, d);
        lower[at(i)][at(j)] = dot * std::exp(cum[at(i)] - cum[at(j)]);
      }
    // (I + L) X = B by forward substitution, for B = beta v and B = beta k exp(G).
    auto solve = [&](int64_t width, const std::function<double(int64_t, int64_t)>& b) {
      std::vector<std::vector<double>> x(at(n), std::vector<double>(at(width), 0.0));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < width; ++c) {
          double acc = b(i, c);
          for (int64_t j = 0; j < i; ++j)
            acc -= lower[at(i)][at(j)] * x[at(j)][at(c)];
          x[at(i)][at(c)] = acc;
        }
      return x;
    };
    const auto u = solve(dv, [&](int64_t i, int64_t e) { return bv(i) * vv(i, e); });
    const auto w =
        solve(dk, [&](int64_t i, int64_t d) { return bv(i) * kv(i, d) * std::exp(cum[at(i)]); });
    // v_new = u - w S; o = (q exp(G)) S + intra v_new; S = S exp(G_last) + (k exp(G_last - G))^T
    // v_new
    std::vector<std::vector<double>> vnew(at(n), std::vector<double>(at(dv), 0.0));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < dv; ++e) {
        double ws = 0.0;
        for (int64_t d = 0; d < dk; ++d)
          ws += w[at(i)][at(d)] * s[at(d * dv + e)];
        vnew[at(i)][at(e)] = u[at(i)][at(e)] - ws;
      }
    for (int64_t i = 0; i < n && valid(i); ++i)
      for (int64_t e = 0; e < dv; ++e) {
        double inter = 0.0;
        for (int64_t d = 0; d < dk; ++d)
          inter += qv(i, d) * std::exp(cum[at(i)]) * s[at(d * dv + e)];
        double intra = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double qk = 0.0;
          for (int64_t d = 0; d < dk; ++d)
            qk += qv(i, d) * kv(j, d);
          intra += qk * std::exp(cum[at(i)] - cum[at(j)]) * vnew[at(j)][at(e)];
        }
        o[at((c0 + i) * dv + e)] = inter + intra;
      }
    const double last = cum[at(n - 1)];
    for (int64_t d = 0; d < dk; ++d)
      for (int64_t e = 0; e < dv; ++e) {
        double add = 0.0;
        for (int64_t i = 0; i < n; ++i)
          add += kv(i, d) * std::exp(last - cum[at(i)]) * vnew[at(i)][at(e)];
        s[at(d * dv + e)] = s[at(d * dv + e)] * std::exp(last) + add;
      }
  }
  return o;
}

std::vector<double> normalized(const double* x, int64_t n, double scale) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i)
    ss += x[i] * x[i];
  std::vector<double> out(at(n));
  for (int64_t i = 0; i < n; ++i)
    out[at(i)] = x[i] / std::sqrt(ss + 1e-6) * scale;
  return out;
}

TEST(GatedDeltaNet, SequentialRuleEqualsTheChunkedForm) {
  std::mt19937_64 rng(test_seed());
  const int64_t hk = 2, hv = 4, dk = 8, dv = 6, t_count = 29;
  GatedDeltaNetParams p = params(hk, hv, dk, dv, 4, rng);
  const Matrix conv = random_matrix(t_count, p.dims.conv_dim(), 1.0, rng);
  Matrix beta(t_count, hv), g(t_count, hv);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t j = 0; j < hv; ++j) {
      beta(t, j) = u(rng);
      g(t, j) = -0.8 * u(rng);
    }
  // Two calls (13 + 16 tokens): the second continues from the state the first left.
  GatedDeltaNetState st;
  Matrix first = reference::gated_delta_rule(row_range(conv, 0, 13), row_range(beta, 0, 13),
                                             row_range(g, 0, 13), p, st, false);
  Matrix second =
      reference::gated_delta_rule(row_range(conv, 13, t_count), row_range(beta, 13, t_count),
                                  row_range(g, 13, t_count), p, st, false);
  Matrix seq(t_count, hv * dv);
  std::copy(first.data.begin(), first.data.end(), seq.data.begin());
  std::copy(second.data.begin(), second.data.end(), seq.data.begin() + 13 * hv * dv);

  Matrix chunked(t_count, hv * dv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  for (int64_t j = 0; j < hv; ++j) {
    const int64_t h = j / (hv / hk);
    std::vector<std::vector<double>> q, k, v;
    std::vector<double> bj, gj;
    for (int64_t t = 0; t < t_count; ++t) {
      const double* row = &conv.data[at(t * conv.cols)];
      q.push_back(normalized(row + h * dk, dk, scale));
      k.push_back(normalized(row + hk * dk + h * dk, dk, 1.0));
      v.emplace_back(row + 2 * hk * dk + j * dv, row + 2 * hk * dk + (j + 1) * dv);
      bj.push_back(beta(t, j));
      gj.push_back(g(t, j));
    }
    std::vector<double> s(at(dk * dv), 0.0);
    const std::vector<double> o = chunked_head(q, k, v, bj, gj, 8, s);
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t e = 0; e < dv; ++e)
        chunked(t, j * dv + e) = o[at(t * dv + e)];
    // The final state too: [HV, dk, dv].
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < dk * dv; ++i) {
      const double a = st.s[at(j * dk * dv + i)];
      num += (a - s[at(i)]) * (a - s[at(i)]);
      den += s[at(i)] * s[at(i)];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-13) << "value head " << j << "'s final state";
  }
  EXPECT_LT(rel_l2(seq, chunked), 1e-13);
  // The test can fail: a decay applied after the read instead of before moves the output.
  GatedDeltaNetState fresh;
  Matrix shifted_g = g;
  for (double& x : shifted_g.data)
    x *= 0.5;
  const Matrix other = reference::gated_delta_rule(conv, beta, shifted_g, p, fresh, false);
  EXPECT_GT(rel_l2(other, chunked), 1e-3);
}

TEST(GatedDeltaNet, PrefillEqualsTokenByTokenDecodeBitForBit) {
  std::mt19937_64 rng(test_seed() + 1);
  GatedDeltaNetParams p = params(2, 4, 8, 8, 4, rng);
  const int64_t t_count = 9;
  const Matrix x = random_matrix(t_count, p.dims.conv_dim(), 1.0, rng);
  const Matrix b = random_matrix(t_count, 4, 1.0, rng), a = random_matrix(t_count, 4, 1.0, rng);
  auto run = [&](int64_t begin, int64_t end, GatedDeltaNetState& st, Matrix* states) {
    const Matrix c = reference::causal_conv_silu(row_range(x, begin, end), p, st);
    Matrix beta, g;
    reference::delta_rule_gates(row_range(b, begin, end), row_range(a, begin, end), p, beta, g);
    return reference::gated_delta_rule(c, beta, g, p, st, false, states);
  };
  GatedDeltaNetState whole_state;
  Matrix states;
  const Matrix whole = run(0, t_count, whole_state, &states);
  GatedDeltaNetState step_state;
  for (int64_t t = 0; t < t_count; ++t) {
    Matrix one_state;
    const Matrix one = run(t, t + 1, step_state, &one_state);
    for (int64_t c = 0; c < one.cols; ++c)
      ASSERT_EQ(one(0, c), whole(t, c)) << "token " << t << " channel " << c;
    for (int64_t c = 0; c < one_state.cols; ++c)
      ASSERT_EQ(one_state(0, c), states(t, c)) << "state after token " << t;
  }
  EXPECT_EQ(step_state.s, whole_state.s);
  EXPECT_EQ(step_state.conv_inputs.data, whole_state.conv_inputs.data);
}

TEST(GatedDeltaNet, CausalConvHandWorked) {
  GatedDeltaNetParams p;
  p.dims = {3, 1, 1, 1, 1};                 // K = 3; C = 2 + 1 = 3 channels
  p.conv = {1, 2, 3, 0.5, 0, -1, 0, 0, 1};  // channel-major [C, K], tap 2 the newest
  Matrix x(2, 3);
  x.data = {1, 2, 3, 4, 5, 6};
  GatedDeltaNetState st;
  const Matrix y = reference::causal_conv_silu(x, p, st);
  using reference::silu;
  // token 0 sees (0, 0, x0); token 1 sees (0, x0, x1)
  EXPECT_EQ(y(0, 0), silu(3.0 * 1));
  EXPECT_EQ(y(0, 1), silu(-1.0 * 2));
  EXPECT_EQ(y(0, 2), silu(1.0 * 3));
  EXPECT_EQ(y(1, 0), silu(2.0 * 1 + 3.0 * 4));
  EXPECT_EQ(y(1, 1), silu(0.0 * 2 + -1.0 * 5));
  EXPECT_EQ(y(1, 2), silu(6.0));
  // The state keeps the last K - 1 pre-conv rows.
  EXPECT_EQ(st.conv_inputs.data, (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(GatedDeltaNet, GatesHandWorkedWithSoftplusThreshold) {
  GatedDeltaNetParams p;
  p.dims = {4, 1, 1, 1, 3};
  p.a_log = {0.0, std::log(2.0), 0.0};
  p.dt_bias = {0.0, 1.0, 5.0};
  Matrix b(1, 3), a(1, 3);
  b.data = {0.0, 2.0, -1.0};
  a.data = {0.0, -1.0, 20.5};  // a + dt_bias = 0, 0, 25.5 (past the threshold: softplus = x)
  Matrix beta, g;
  reference::delta_rule_gates(b, a, p, beta, g);
  EXPECT_EQ(beta(0, 0), 0.5);
  EXPECT_DOUBLE_EQ(beta(0, 1), 1.0 / (1.0 + std::exp(-2.0)));
  EXPECT_EQ(g(0, 0), -std::log(2.0));
  EXPECT_DOUBLE_EQ(g(0, 1), -2.0 * std::log(2.0));
  EXPECT_EQ(g(0, 2), -25.5);
}

TEST(GatedDeltaNet, GatedNormHandWorked) {
  GatedDeltaNetParams p;
  p.dims = {4, 1, 2, 1, 2};  // two value heads of 2
  p.norm = {2.0, 0.5};
  p.eps = 0.0;
  Matrix o(1, 4), z(1, 4);
  o.data = {3.0, 4.0, 1.0, -1.0};
  z.data = {1.0, 0.0, 2.0, -3.0};
  const Matrix y = reference::gated_rms_norm(o, z, p);
  const double r0 = 1.0 / std::sqrt(12.5);  // head 0: mean square (9 + 16) / 2
  using reference::silu;
  EXPECT_DOUBLE_EQ(y(0, 0), 2.0 * 3.0 * r0 * silu(1.0));
  EXPECT_EQ(y(0, 1), 0.0);                           // silu(0) = 0
  EXPECT_DOUBLE_EQ(y(0, 2), 2.0 * 1.0 * silu(2.0));  // head 1: unit mean square
  EXPECT_DOUBLE_EQ(y(0, 3), 0.5 * -1.0 * silu(-3.0));
}

TEST(GatedDeltaNet, ShapeErrorsNameTheOperand) {
  std::mt19937_64 rng(3);
  GatedDeltaNetParams p = params(1, 2, 4, 4, 4, rng);
  GatedDeltaNetState st;
  try {
    reference::causal_conv_silu(Matrix(2, 5), p, st);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the conv input"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qparity::test
