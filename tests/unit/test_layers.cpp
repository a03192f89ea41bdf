// Shared fp64 blocks of the reference (reference_cpu/layers/): RMSNorm, RoPE, causal GQA
// attention, SiLU-and-mul and the Qwen3-MoE router, against hand-worked values and independent
// loops written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#include "core/config/model_config.h"
#include "error_of.h"
#include "quant_test_util.h"
#include "reference_cpu/layers/activation.h"
#include "reference_cpu/layers/attention.h"
#include "reference_cpu/layers/moe_router.h"
#include "reference_cpu/layers/rms_norm.h"
#include "reference_cpu/layers/rope.h"
#include "test_seed.h"

namespace qparity::test {
namespace {

using reference::causal_attention;
using reference::Rope;
using reference::Routing;

Matrix from_rows(const std::vector<std::vector<double>>& rows) {
  Matrix m(static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.front().size()));
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t c = 0; c < rows[r].size(); ++c)
      m(static_cast<int64_t>(r), static_cast<int64_t>(c)) = rows[r][c];
  return m;
}

Matrix rows_of(const Matrix& m, int64_t begin, int64_t end) {
  Matrix out(end - begin, m.cols);
  std::copy(m.data.begin() + begin * m.cols, m.data.begin() + end * m.cols, out.data.begin());
  return out;
}

void expect_rel_near(double got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * std::fabs(want))
      << what << ": got " << got << ", want " << want;
}

// ---------------------------------------------------------------- RMSNorm

TEST(RmsNorm, HandWorkedExactRow) {
  // mean(x^2) = 4, eps 0: r = 1/sqrt(4) = 0.5 exactly, x * r = 1, y = w.
  const Matrix x = from_rows({{2.0, -2.0, 2.0, -2.0}});
  const std::vector<double> w = {0.5, 1.5, -3.0, 7.0};
  const Matrix y = reference::rms_norm(x, w, 0.0);
  EXPECT_EQ(y.data, (std::vector<double>{0.5, -1.5, -3.0, -7.0}));
}

TEST(RmsNorm, HandWorkedWithEpsAndBias) {
  // x = [1, 3, 5, 7]: sum of squares 84, mean 21, + eps 4 = 25, r = 1/5.
  const Matrix x = from_rows({{1.0, 3.0, 5.0, 7.0}});
  const std::vector<double> w = {1.0, 2.0, 0.5, -1.0};
  const std::vector<double> b = {0.25, -0.25, 1.0, 0.0};
  const Matrix y = reference::rms_norm(x, w, 4.0, b);
  const std::vector<double> want = {0.2 + 0.25, 1.2 - 0.25, 0.5 + 1.0, -1.4};
  for (size_t j = 0; j < want.size(); ++j)
    expect_rel_near(y.data[j], want[j], 4e-16, "column " + std::to_string(j));
  // The stated order: w * (x * (1 / sqrt(v + eps))) [+ b], bit for bit.
  const double r = 1.0 / std::sqrt(84.0 / 4.0 + 4.0);
  for (size_t j = 0; j < want.size(); ++j)
    EXPECT_EQ(y.data[j], w[j] * (x.data[j] * r) + b[j]);
}

TEST(RmsNorm, RowsAreIndependentAndUnitRms) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const Matrix x = realistic_matrix(rng, 6, 64, 1.0);
  const std::vector<double> ones(64, 1.0);
  const Matrix y = reference::rms_norm(x, ones, 0.0);
  for (int64_t t = 0; t < y.rows; ++t) {
    double ss = 0;
    for (double v : y.row(t))
      ss += v * v;
    EXPECT_NEAR(ss / 64.0, 1.0, 1e-14) << "row " << t;
    const Matrix single = reference::rms_norm(rows_of(x, t, t + 1), ones, 0.0);
    EXPECT_EQ(single.data, rows_of(y, t, t + 1).data) << "row " << t;
  }
}

TEST(RmsNorm, PerHeadNormalizesEachHeadAlone) {
  // Two heads of 2: head 0 = [1, 1] (mean square 1), head 1 = [3, -3] (mean square 9).
  const Matrix x = from_rows({{1.0, 1.0, 3.0, -3.0}});
  const std::vector<double> w = {2.0, 0.5};
  const Matrix y = reference::rms_norm_heads(x, 2, w, 0.0);
  EXPECT_EQ(y(0, 0), 2.0);
  EXPECT_EQ(y(0, 1), 0.5);
  EXPECT_NEAR(y(0, 2), 2.0, 1e-15);
  EXPECT_NEAR(y(0, 3), -0.5, 1e-15);
  // Equal to rms_norm on each head's slice.
  const Matrix h1 = reference::rms_norm(from_rows({{3.0, -3.0}}), w, 0.0);
  EXPECT_EQ(y(0, 2), h1(0, 0));
  EXPECT_EQ(y(0, 3), h1(0, 1));
}

TEST(RmsNorm, ShapeErrorsNameTheProblem) {
  const Matrix x(2, 4, 1.0);
  const std::vector<double> w3(3, 1.0), w4(4, 1.0), w2(2, 1.0);
  EXPECT_NE(error_of([&] { reference::rms_norm(x, w3, 1e-6); }).find("weight has 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::rms_norm(x, w4, 1e-6, w3); }).find("bias has 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::rms_norm(x, w4, -1.0); }).find("eps"), std::string::npos);
  EXPECT_NE(error_of([&] {
              reference::rms_norm_heads(x, 3, w3, 1e-6);
            }).find("not a positive multiple of head_dim 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::rms_norm_heads(x, 2, w4, 1e-6); }).find("head_dim is 2"),
            std::string::npos);
}

// ---------------------------------------------------------------- RoPE

ModelConfig rope_config(int64_t head_dim, double theta) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.hidden = head_dim * 2;
  c.rope_theta = theta;
  return c;
}

TEST(Rope, DefaultInvFreqClosedForm) {
  const Rope rope(rope_config(8, 10000.0));
  // 10000^(-2i/8) = 1, 0.1, 0.01, 0.001.
  const std::vector<double> want = {1.0, 0.1, 0.01, 0.001};
  ASSERT_EQ(rope.inv_freq().size(), 4u);
  EXPECT_EQ(rope.inv_freq()[0], 1.0);
  for (size_t i = 0; i < want.size(); ++i)
    expect_rel_near(rope.inv_freq()[i], want[i], 4e-16, "inv_freq " + std::to_string(i));
  // The stated order: 1.0 / pow(base, double(2i) / dim).
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(rope.inv_freq()[i], 1.0 / std::pow(10000.0, static_cast<double>(2 * i) / 8.0));
  EXPECT_EQ(rope.attention_scaling(), 1.0);
}

TEST(Rope, LinearDividesByFactor) {
  ModelConfig c = rope_config(8, 10000.0);
  const Rope plain(c);
  c.rope_scaling.type = RopeType::kLinear;
  c.rope_scaling.factor = 4.0;
  const Rope linear(c);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(linear.inv_freq()[i], plain.inv_freq()[i] / 4.0);
}

TEST(Rope, Llama3FactorsMatchHandComputedValues) {
  // theta 500000, head_dim 16 (8 frequencies), factor 8, low 1, high 4, original 8192.
  // wavelen_i = 2 pi 500000^(i/8): i <= 3 are below high_freq_wavelen = 2048 (kept), i = 4
  // (4442.88) lies between 2048 and low_freq_wavelen = 8192 (smoothed), i >= 5 are above 8192
  // (divided by 8). Values from transformers' formula evaluated at 30 digits.
  ModelConfig c = rope_config(16, 500000.0);
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const Rope rope(c);
  const std::vector<double> want = {
      1.0,
      0.193922744748685773342593855674,
      0.0376060309308639356812460923452,
      0.00729266473721710904776612194338,
      0.000524846160992954669727291089868,  // (1 - s) inv / 8 + s inv, s = 0.2812826051632511
      0.0000342810219595259147816653309158,
      0.00000664786987118123577031280357226,
      0.00000128917317215155735747626590404,
  };
  ASSERT_EQ(rope.inv_freq().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expect_rel_near(rope.inv_freq()[i], want[i], 2e-15, "llama3 inv_freq " + std::to_string(i));
  // The medium band independently: inv * ((1 - s) / 8 + s) with s from the closed form.
  const double inv4 = 1.0 / std::sqrt(500000.0);
  const double s = (8192.0 / (2.0 * std::numbers::pi / inv4) - 1.0) / 3.0;
  expect_rel_near(s, 0.281282605163251076816349314394, 1e-14, "smooth factor");
  expect_rel_near(rope.inv_freq()[4], inv4 * ((1.0 - s) / 8.0 + s), 1e-15, "smoothed");
}

TEST(Rope, UnsupportedTypesAreNamed) {
  ModelConfig yarn = rope_config(8, 10000.0);
  yarn.rope_scaling.type = RopeType::kYarn;
  yarn.rope_scaling.factor = 2.0;
  EXPECT_NE(error_of([&] { Rope r(yarn); }).find("original_max_position_embeddings"),
            std::string::npos);
  for (RopeType t : {RopeType::kDynamic, RopeType::kLongrope}) {
    ModelConfig c = rope_config(8, 10000.0);
    c.rope_scaling.type = t;
    c.rope_scaling.factor = 2.0;
    const std::string msg = error_of([&] { Rope r(c); });
    EXPECT_NE(msg.find("'" + std::string(rope_type_name(t)) + "'"), std::string::npos) << msg;
  }
  ModelConfig odd = rope_config(7, 10000.0);
  EXPECT_NE(error_of([&] { Rope r(odd); }).find("head_dim 7"), std::string::npos);
  ModelConfig llama3 = rope_config(8, 10000.0);
  llama3.rope_scaling.type = RopeType::kLlama3;
  llama3.rope_scaling.factor = 8.0;
  EXPECT_NE(error_of([&] { Rope r(llama3); }).find("low_freq_factor"), std::string::npos);
}

TEST(Rope, CosSinLayoutIsCatOfFreqs) {
  const Rope rope(rope_config(8, 10000.0));
  std::vector<double> cos, sin;
  rope.cos_sin(37, cos, sin);
  ASSERT_EQ(cos.size(), 8u);
  for (size_t i = 0; i < 4; ++i) {
    const double angle = 37.0 * rope.inv_freq()[i];
    EXPECT_EQ(cos[i], std::cos(angle));
    EXPECT_EQ(cos[i + 4], std::cos(angle));
    EXPECT_EQ(sin[i], std::sin(angle));
    EXPECT_EQ(sin[i + 4], std::sin(angle));
  }
}

TEST(Rope, RotateHalfConventionOnAUnitVector) {
  // e_0 at position p rotates into the (0, dim/2) pair: [cos t, 0, 0, 0, sin t, 0, 0, 0] with
  // t = p * inv_freq[0] = p (an interleaved convention would put sin t in column 1).
  const Rope rope(rope_config(8, 10000.0));
  Matrix x(1, 8);
  x(0, 0) = 1.0;
  const std::vector<int64_t> pos = {3};
  rope.apply(x, 1, pos);
  const std::vector<double> want = {std::cos(3.0), 0, 0, 0, std::sin(3.0), 0, 0, 0};
  for (size_t j = 0; j < 8; ++j)
    EXPECT_NEAR(x.data[j], want[j], 1e-16) << "column " << j;
  // Position 0 is the identity, exactly.
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const Matrix y0 = gaussian_matrix(rng, 1, 16);
  Matrix y = y0;
  const std::vector<int64_t> zero = {0};
  rope.apply(y, 2, zero);
  EXPECT_EQ(y.data, y0.data);
}

TEST(Rope, ApplyIsThePairRotationByPositionTimesInvFreq) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  ModelConfig c = rope_config(16, 500000.0);
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const Rope rope(c);
  const int64_t heads = 3, dim = 16, half = 8;
  const Matrix x0 = gaussian_matrix(rng, 5, heads * dim);
  std::uniform_int_distribution<int64_t> pos_dist(0, 100000);
  std::vector<int64_t> pos(5);
  for (auto& p : pos)
    p = pos_dist(rng);
  Matrix x = x0;
  rope.apply(x, heads, pos);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double theta = static_cast<double>(pos[static_cast<size_t>(t)]) *
                             rope.inv_freq()[static_cast<size_t>(i)];
        const double a = x0(t, h * dim + i), b = x0(t, h * dim + half + i);
        const double ra = a * std::cos(theta) - b * std::sin(theta);
        const double rb = b * std::cos(theta) + a * std::sin(theta);
        EXPECT_NEAR(x(t, h * dim + i), ra, 1e-15 * (std::fabs(a) + std::fabs(b)));
        EXPECT_NEAR(x(t, h * dim + half + i), rb, 1e-15 * (std::fabs(a) + std::fabs(b)));
      }
}

TEST(Rope, ScoresDependOnlyOnRelativePosition) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const Rope rope(rope_config(32, 10000.0));
  const Matrix q0 = gaussian_matrix(rng, 1, 32), k0 = gaussian_matrix(rng, 1, 32);
  auto score = [&](int64_t pq, int64_t pk) {
    Matrix q = q0, k = k0;
    const std::vector<int64_t> a = {pq}, b = {pk};
    rope.apply(q, 1, a);
    rope.apply(k, 1, b);
    double s = 0;
    for (size_t j = 0; j < 32; ++j)
      s += q.data[j] * k.data[j];
    return s;
  };
  const double base = score(7, 2);
  EXPECT_NEAR(score(1007, 1002), base, 1e-11);
  EXPECT_NEAR(score(5, 0), base, 1e-12);
  EXPECT_GT(std::fabs(score(8, 2) - base), 1e-6);  // and it does depend on the offset
}

TEST(Rope, ApplyShapeErrors) {
  const Rope rope(rope_config(8, 10000.0));
  Matrix x(2, 16);
  const std::vector<int64_t> one = {0}, two = {0, 1}, neg = {0, -1};
  EXPECT_NE(error_of([&] { rope.apply(x, 3, two); }).find("input width 16 != num_heads 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rope.apply(x, 2, one); }).find("1 positions for 2 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rope.apply(x, 2, neg); }).find("position -1"), std::string::npos);
}

// ---------------------------------------------------------------- attention

// Naive per-(token, head) attention written independently: masked scores at -inf, softmax
// normalized at the end (sum of e * v, then one divide), kv head chosen by h / (H / Hkv).
Matrix naive_attention(const Matrix& q, const Matrix& k, const Matrix& v,
                       const std::vector<int64_t>& qp, const std::vector<int64_t>& kp, int64_t h_n,
                       int64_t hkv, int64_t d_n, double scaling) {
  Matrix out(q.rows, q.cols);
  for (int64_t t = 0; t < q.rows; ++t)
    for (int64_t h = 0; h < h_n; ++h) {
      const int64_t g = h / (h_n / hkv);
      std::vector<double> sc(static_cast<size_t>(k.rows), -INFINITY);
      double mx = -INFINITY;
      for (int64_t s = 0; s < k.rows; ++s) {
        if (kp[static_cast<size_t>(s)] > qp[static_cast<size_t>(t)]) continue;
        double dot = 0;
        for (int64_t d = 0; d < d_n; ++d)
          dot += q(t, h * d_n + d) * k(s, g * d_n + d);
        sc[static_cast<size_t>(s)] = dot * scaling;
        mx = std::max(mx, sc[static_cast<size_t>(s)]);
      }
      std::vector<double> num(static_cast<size_t>(d_n), 0.0);
      double z = 0;
      for (int64_t s = 0; s < k.rows; ++s) {
        const double e = std::exp(sc[static_cast<size_t>(s)] - mx);
        z += e;
        for (int64_t d = 0; d < d_n; ++d)
          num[static_cast<size_t>(d)] += e * v(s, g * d_n + d);
      }
      for (int64_t d = 0; d < d_n; ++d)
        out(t, h * d_n + d) = num[static_cast<size_t>(d)] / z;
    }
  return out;
}

struct AttnCase {
  int64_t t = 7, h = 4, hkv = 2, d = 8;
  Matrix q, k, v;
  std::vector<int64_t> pos;
  double scaling = 0;
  explicit AttnCase(std::mt19937_64& rng) {
    q = gaussian_matrix(rng, t, h * d, 1.5);
    k = gaussian_matrix(rng, t, hkv * d, 1.5);
    v = gaussian_matrix(rng, t, hkv * d);
    pos.resize(static_cast<size_t>(t));
    std::iota(pos.begin(), pos.end(), int64_t{3});
    scaling = 1.0 / std::sqrt(static_cast<double>(d));
  }
};

TEST(Attention, MatchesNaivePerHeadSoftmax) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const AttnCase c(rng);
  const Matrix got = causal_attention(c.q, c.k, c.v, c.pos, c.pos, c.h, c.hkv, c.d, c.scaling);
  const Matrix want = naive_attention(c.q, c.k, c.v, c.pos, c.pos, c.h, c.hkv, c.d, c.scaling);
  EXPECT_LT(relative_l2(got, want), 1e-14);
  EXPECT_LT(max_abs_diff(got, want), 1e-14);
  // The first query sees only key 0: its output is v row 0 (per kv head), exactly.
  for (int64_t h = 0; h < c.h; ++h)
    for (int64_t d = 0; d < c.d; ++d)
      EXPECT_EQ(got(0, h * c.d + d), c.v(0, (h / 2) * c.d + d));
}

// The fixed summation order the reference documents, written one operation at a time: q.k over
// ascending d, the softmax sum over ascending keys, each output channel's p * v over ascending
// keys. causal_attention's blocked loops (four keys at a time, channels inside) must give these
// bits exactly, for any count of visible keys (remainders of the four).
TEST(Attention, BlockedLoopsKeepTheDocumentedSumOrderBitForBit) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t t_n = 13, h_n = 4, hkv = 2, d_n = 24;
  const Matrix q = gaussian_matrix(rng, t_n, h_n * d_n, 1.5),
               k = gaussian_matrix(rng, t_n, hkv * d_n, 1.5),
               v = gaussian_matrix(rng, t_n, hkv * d_n);
  std::vector<int64_t> pos(static_cast<size_t>(t_n));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  const double scaling = 1.0 / std::sqrt(static_cast<double>(d_n));
  const Matrix got = causal_attention(q, k, v, pos, pos, h_n, hkv, d_n, scaling);
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t h = 0; h < h_n; ++h) {
      const int64_t g = h / (h_n / hkv);
      std::vector<double> p(static_cast<size_t>(t + 1));
      double m = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        volatile double dot = 0.0;
        for (int64_t d = 0; d < d_n; ++d) {
          volatile double prod = q(t, h * d_n + d) * k(s, g * d_n + d);
          dot = dot + prod;
        }
        p[static_cast<size_t>(s)] = dot * scaling;
        m = std::max(m, p[static_cast<size_t>(s)]);
      }
      volatile double z = 0.0;
      for (auto& e : p) {
        e = std::exp(e - m);
        z = z + e;
      }
      for (auto& e : p)
        e = e / z;
      for (int64_t d = 0; d < d_n; ++d) {
        volatile double acc = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          volatile double prod = p[static_cast<size_t>(s)] * v(s, g * d_n + d);
          acc = acc + prod;
        }
        ASSERT_EQ(got(t, h * d_n + d), acc) << "token " << t << " head " << h << " channel " << d;
      }
    }
}

TEST(Attention, GqaHeadUsesKvHeadHOverGroup) {
  // H = 6, Hkv = 3 (group 2): every value of kv head g is g + 1, so head h outputs h / 2 + 1.
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t h_n = 6, hkv = 3, d = 4, t_n = 5;
  const Matrix q = gaussian_matrix(rng, t_n, h_n * d), k = gaussian_matrix(rng, t_n, hkv * d);
  Matrix v(t_n, hkv * d);
  for (int64_t s = 0; s < t_n; ++s)
    for (int64_t g = 0; g < hkv; ++g)
      for (int64_t j = 0; j < d; ++j)
        v(s, g * d + j) = static_cast<double>(g + 1);
  std::vector<int64_t> pos(static_cast<size_t>(t_n));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  const Matrix out = causal_attention(q, k, v, pos, pos, h_n, hkv, d, 0.5);
  // The output is (sum of the softmax weights) * (g + 1): the weights sum to 1 up to a rounding
  // per key and the normalization's, so within 16 ulps of the value (1e-15 absolute was a guess
  // that a seed broke at 1.3e-15 on a value of 3).
  const auto tol = [](double x) { return 16 * std::numeric_limits<double>::epsilon() * x; };
  for (int64_t t = 0; t < t_n; ++t)
    for (int64_t h = 0; h < h_n; ++h)
      for (int64_t j = 0; j < d; ++j)
        EXPECT_NEAR(out(t, h * d + j), static_cast<double>(h / 2 + 1), tol(h / 2 + 1))
            << "token " << t << " head " << h;
  // A mapping h % Hkv (interleaved) would differ: head 1 would read kv head 1.
  EXPECT_NEAR(out(0, 1 * d), 1.0, tol(1.0));
}

TEST(Attention, FutureKeysDoNotChangeEarlierOutputs) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const AttnCase c(rng);
  const Matrix base = causal_attention(c.q, c.k, c.v, c.pos, c.pos, c.h, c.hkv, c.d, c.scaling);
  Matrix k2 = c.k, v2 = c.v;
  for (int64_t s = 4; s < c.t; ++s)
    for (int64_t j = 0; j < c.k.cols; ++j) {
      k2(s, j) += 100.0;
      v2(s, j) -= 50.0;
    }
  const Matrix changed = causal_attention(c.q, k2, v2, c.pos, c.pos, c.h, c.hkv, c.d, c.scaling);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t j = 0; j < base.cols; ++j)
      EXPECT_EQ(changed(t, j), base(t, j)) << "token " << t;
  bool later_changed = false;
  for (int64_t j = 0; j < base.cols; ++j)
    later_changed = later_changed || changed(4, j) != base(4, j);
  EXPECT_TRUE(later_changed);
}

TEST(Attention, PrefillEqualsIncrementalDecode) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const AttnCase c(rng);
  const Matrix prefill = causal_attention(c.q, c.k, c.v, c.pos, c.pos, c.h, c.hkv, c.d, c.scaling);
  for (int64_t t = 0; t < c.t; ++t) {
    const Matrix q1 = rows_of(c.q, t, t + 1);
    const Matrix kc = rows_of(c.k, 0, t + 1), vc = rows_of(c.v, 0, t + 1);
    const std::vector<int64_t> qp = {c.pos[static_cast<size_t>(t)]};
    const std::vector<int64_t> kp(c.pos.begin(), c.pos.begin() + t + 1);
    const Matrix step = causal_attention(q1, kc, vc, qp, kp, c.h, c.hkv, c.d, c.scaling);
    for (int64_t j = 0; j < step.cols; ++j)
      EXPECT_NEAR(step(0, j), prefill(t, j), 1e-14) << "token " << t << " column " << j;
  }
}

TEST(Attention, ShapeErrorsNameTheProblem) {
  const Matrix q(2, 8), k(2, 4), v(2, 4), v3(3, 4), k5(2, 5);
  const std::vector<int64_t> p2 = {0, 1}, p1 = {0}, late = {5, 6};
  auto msg = [&](auto f) { return error_of(f); };
  EXPECT_NE(msg([&] {
              causal_attention(q, k, v, p2, p2, 3, 2, 2, 1.0);
            }).find("num_heads 3 is not a multiple of num_kv_heads 2"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, v, p2, p2, 2, 1, 2, 1.0); }).find("q width 8"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k5, v, p2, p2, 2, 1, 4, 1.0); }).find("k width 5"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, k5, p2, p2, 2, 1, 4, 1.0); }).find("v width 5"),
            std::string::npos);
  EXPECT_NE(
      msg([&] { causal_attention(q, k, v3, p2, p2, 2, 1, 4, 1.0); }).find("k has 2 rows, v has 3"),
      std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, v, p1, p2, 2, 1, 4, 1.0); }).find("q_positions"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, v, p2, p1, 2, 1, 4, 1.0); }).find("kv_positions"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, v, p2, late, 2, 1, 4, 1.0); }).find("sees no key"),
            std::string::npos);
  EXPECT_NE(msg([&] { causal_attention(q, k, v, p2, p2, 2, 0, 4, 1.0); }).find("num_kv_heads 0"),
            std::string::npos);
}

// ---------------------------------------------------------------- activation

TEST(Activation, SiluHandWorkedAndExtremes) {
  EXPECT_EQ(reference::silu(0.0), 0.0);
  expect_rel_near(reference::silu(1.0), 0.731058578630004879251159, 2e-16, "silu(1)");
  expect_rel_near(reference::silu(-2.0), -0.238405844044235111880541717395, 4e-16, "silu(-2)");
  EXPECT_EQ(reference::silu(1000.0), 1000.0);
  const double neg = reference::silu(-1000.0);
  EXPECT_EQ(neg, 0.0);
  EXPECT_TRUE(std::signbit(neg));
}

TEST(Activation, AgreesWithXTimesSigmoidToAFewUlp) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 6.0);
  for (int i = 0; i < 10000; ++i) {
    const double x = g(rng);
    const double sig = x * (1.0 / (1.0 + std::exp(-x)));
    EXPECT_LE(std::fabs(reference::silu(x) - sig), 4e-16 * std::fabs(sig)) << "x = " << x;
  }
}

TEST(Activation, SiluAndMulSplitsGateThenUp) {
  const Matrix gu = from_rows({{1.0, -2.0, 3.0, 0.5}, {0.0, 1.0, 7.0, -4.0}});
  const Matrix y = reference::silu_and_mul(gu);
  ASSERT_EQ(y.rows, 2);
  ASSERT_EQ(y.cols, 2);
  EXPECT_EQ(y(0, 0), reference::silu(1.0) * 3.0);
  EXPECT_EQ(y(0, 1), reference::silu(-2.0) * 0.5);
  EXPECT_EQ(y(1, 0), 0.0);
  EXPECT_EQ(y(1, 1), reference::silu(1.0) * -4.0);
  const Matrix gate = from_rows({{1.0, -2.0}, {0.0, 1.0}}),
               up = from_rows({{3.0, 0.5}, {7.0, -4.0}});
  EXPECT_EQ(reference::silu_and_mul(gate, up).data, y.data);
  EXPECT_NE(error_of([&] { reference::silu_and_mul(Matrix(1, 3)); }).find("gate_up width 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::silu_and_mul(gate, Matrix(2, 3)); }).find("up is [2, 3]"),
            std::string::npos);
}

// ---------------------------------------------------------------- MoE router

TEST(MoeRouter, HandWorkedNormOffAndOn) {
  // logits [1, 2, 3, 4], top 2: experts 3 then 2. Z = 1 + e^-1 + e^-2 + e^-3 (after the max).
  const Matrix logits = from_rows({{1.0, 2.0, 3.0, 4.0}});
  const double z = 1.0 + std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0);
  const Routing off = reference::route_topk(logits, 2, false);
  EXPECT_EQ(off.ids[0], (std::vector<int64_t>{3, 2}));
  expect_rel_near(off.weights[0][0], 1.0 / z, 4e-16, "w0");
  expect_rel_near(off.weights[0][1], std::exp(-1.0) / z, 4e-16, "w1");
  const Routing on = reference::route_topk(logits, 2, true);
  EXPECT_EQ(on.ids[0], (std::vector<int64_t>{3, 2}));
  const double e1 = std::exp(-1.0);
  expect_rel_near(on.weights[0][0], 1.0 / (1.0 + e1), 6e-16, "normalized w0");
  expect_rel_near(on.weights[0][1], e1 / (1.0 + e1), 6e-16, "normalized w1");
}

TEST(MoeRouter, TiesGoToTheLowerExpertIndex) {
  // Equal top values: experts 1 and 2 (lower first); norm gives exactly 1/2 each.
  const Routing r = reference::route_topk(from_rows({{1.0, 3.0, 3.0, 2.0}}), 2, true);
  EXPECT_EQ(r.ids[0], (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.weights[0][0], r.weights[0][1]);
  EXPECT_EQ(r.weights[0][0], 0.5);
  // A tie across the top-k boundary: 2 and 4 tie for the third place; 2 is kept.
  const Routing b = reference::route_topk(from_rows({{0.0, 5.0, 2.0, 5.0, 2.0}}), 3, false);
  EXPECT_EQ(b.ids[0], (std::vector<int64_t>{1, 3, 2}));
  // All equal: the first k experts, each 1/E exactly (exp(0) = 1, Z = 8).
  const Routing all = reference::route_topk(Matrix(1, 8, 0.25), 3, false);
  EXPECT_EQ(all.ids[0], (std::vector<int64_t>{0, 1, 2}));
  for (double w : all.weights[0])
    EXPECT_EQ(w, 0.125);
}

TEST(MoeRouter, MatchesAStableSortOnManyTies) {
  // 128 experts, top 8 (Qwen3-MoE's shape), logits drawn from 6 values so ties are everywhere.
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, 5);
  Matrix logits(16, 128);
  for (auto& l : logits.data)
    l = 0.5 * pick(rng);
  const Routing r = reference::route_topk(logits, 8, true);
  const Matrix p = reference::router_softmax(logits);
  for (int64_t t = 0; t < logits.rows; ++t) {
    std::vector<int64_t> order(128);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p(t, a) > p(t, b); });
    order.resize(8);
    EXPECT_EQ(r.ids[static_cast<size_t>(t)], order) << "token " << t;
    double sum = 0;
    for (double w : r.weights[static_cast<size_t>(t)])
      sum += w;
    EXPECT_NEAR(sum, 1.0, 1e-15);
  }
  double zsum = 0;
  for (int64_t e = 0; e < 128; ++e)
    zsum += p(0, e);
  EXPECT_NEAR(zsum, 1.0, 1e-14);
}

TEST(MoeRouter, ErrorsNameTheProblem) {
  const Matrix logits(2, 4, 0.0);
  EXPECT_NE(error_of([&] { reference::route_topk(logits, 0, false); }).find("top_k 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::route_topk(logits, 5, false); }).find("top_k 5"),
            std::string::npos);
  Matrix bad = logits;
  bad(1, 2) = NAN;
  EXPECT_NE(error_of([&] { reference::route_topk(bad, 2, false); }).find("token 1, expert 2"),
            std::string::npos);
}

// ---------------------------------------------------------------- ChatGLM2 RoPE, sliding window

TEST(Rope, ChatGlm2InterleavedHalfRotation) {
  ModelConfig c = rope_config(8, 10000.0);
  c.rotary_dim = 4;
  c.rope_interleaved = true;
  const Rope rope(c);
  // RotaryEmbedding(4): 1 / 10000^(0/4), 1 / 10000^(2/4) = 1, 0.01.
  ASSERT_EQ(rope.inv_freq().size(), 2u);
  EXPECT_EQ(rope.inv_freq()[0], 1.0);
  EXPECT_EQ(rope.inv_freq()[1], 1.0 / std::pow(10000.0, 0.5));
  Matrix x(1, 16);
  for (int64_t j = 0; j < 16; ++j)
    x.data[static_cast<size_t>(j)] = 0.5 + j;
  const Matrix in = x;
  const std::vector<int64_t> pos = {3};
  rope.apply(x, 2, pos);
  for (int64_t h = 0; h < 2; ++h) {
    const double* a = in.data.data() + h * 8;
    const double* b = x.data.data() + h * 8;
    for (int64_t i = 0; i < 2; ++i) {  // pairs (0,1) and (2,3)
      const double ang = 3.0 * rope.inv_freq()[static_cast<size_t>(i)];
      EXPECT_EQ(b[2 * i], a[2 * i] * std::cos(ang) - a[2 * i + 1] * std::sin(ang));
      EXPECT_EQ(b[2 * i + 1], a[2 * i + 1] * std::cos(ang) + a[2 * i] * std::sin(ang));
    }
    for (int64_t j = 4; j < 8; ++j)
      EXPECT_EQ(b[j], a[j]) << "dim " << j << " passes through";
  }
}

TEST(Rope, InterleavedEqualsRotateHalfOnPermutedDims) {
  // Pair i of the interleaved layout at (2i, 2i+1) is rotate-half's pair at (i, i + d/2): the
  // same numbers moved, bit for bit (what lets a rotate-half kernel run ChatGLM2).
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  ModelConfig ci = rope_config(16, 10000.0), ch = rope_config(16, 10000.0);
  ci.rope_interleaved = true;
  const Rope inter(ci), half(ch);
  const Matrix x = gaussian_matrix(rng, 3, 32);
  Matrix xp(3, 32);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 8; ++i) {
        xp(t, h * 16 + i) = x(t, h * 16 + 2 * i);
        xp(t, h * 16 + 8 + i) = x(t, h * 16 + 2 * i + 1);
      }
  Matrix a = x, b = xp;
  const std::vector<int64_t> pos = {0, 5, 4000};
  inter.apply(a, 2, pos);
  half.apply(b, 2, pos);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 8; ++i) {
        EXPECT_EQ(a(t, h * 16 + 2 * i), b(t, h * 16 + i));
        EXPECT_EQ(a(t, h * 16 + 2 * i + 1), b(t, h * 16 + 8 + i));
      }
}

TEST(Attention, SlidingWindowSeesTheLastWPositions) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t T = 6, W = 3, d = 4;
  const Matrix q = gaussian_matrix(rng, T, 2 * d), k = gaussian_matrix(rng, T, d),
               v = gaussian_matrix(rng, T, d);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t)
    pos[static_cast<size_t>(t)] = t;
  const Matrix win = causal_attention(q, k, v, pos, pos, 2, 1, d, 0.5, W);
  for (int64_t t = 0; t < T; ++t) {
    // Query t alone against keys max(0, t - W + 1) .. t: full causal attention over that slice.
    const int64_t first = std::max<int64_t>(0, t - W + 1);
    Matrix qt(1, 2 * d), ks(t - first + 1, d), vs(t - first + 1, d);
    std::copy_n(q.row(t).data(), 2 * d, qt.data.begin());
    std::vector<int64_t> kp;
    for (int64_t s = first; s <= t; ++s) {
      std::copy_n(k.row(s).data(), d, ks.row(s - first).data());
      std::copy_n(v.row(s).data(), d, vs.row(s - first).data());
      kp.push_back(s);
    }
    const std::vector<int64_t> qp = {t};
    const Matrix want = causal_attention(qt, ks, vs, qp, kp, 2, 1, d, 0.5);
    for (int64_t j = 0; j < 2 * d; ++j)
      EXPECT_EQ(win(t, j), want(0, j)) << "query " << t << " col " << j;
  }
  // Inside the window the mask is plain causal.
  const Matrix full = causal_attention(q, k, v, pos, pos, 2, 1, d, 0.5);
  const Matrix wide = causal_attention(q, k, v, pos, pos, 2, 1, d, 0.5, T);
  EXPECT_EQ(full.data, wide.data);
  EXPECT_NE(full.data, win.data);
  EXPECT_NE(error_of([&] {
              causal_attention(q, k, v, pos, pos, 2, 1, d, 0.5, -1);
            }).find("sliding window -1"),
            std::string::npos);
}

// gpt-oss's sinks: one more logit per head in the softmax's max and denominator, no value row.
TEST(Attention, SinksJoinTheDenominatorOnly) {
  const int64_t h = 2, d = 2;
  Matrix q(2, h * d), k(2, d), v(2, d);
  q.data = {0.5, -1.0, 2.0, 0.25, 1.5, 0.75, -0.5, 1.0};
  k.data = {1.0, 0.5, -0.25, 2.0};
  v.data = {3.0, -1.0, 0.5, 4.0};
  const std::vector<int64_t> pos = {0, 1};
  const std::vector<double> sinks = {0.7, 40.0};  // head 1: the sink dwarfs every score
  const Matrix got = reference::causal_attention(q, k, v, pos, pos, h, 1, d, 0.5, 0, sinks);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t hh = 0; hh < h; ++hh) {
      std::vector<double> sc;
      for (int64_t s = 0; s <= t; ++s)
        sc.push_back((q(t, hh * d) * k(s, 0) + q(t, hh * d + 1) * k(s, 1)) * 0.5);
      double m = sinks[static_cast<size_t>(hh)];
      for (double x : sc)
        m = std::max(m, x);
      double z = 0.0;
      for (double x : sc)
        z += std::exp(x - m);
      z += std::exp(sinks[static_cast<size_t>(hh)] - m);
      for (int64_t c = 0; c < d; ++c) {
        double want = 0.0;
        for (int64_t s = 0; s <= t; ++s)
          want += std::exp(sc[static_cast<size_t>(s)] - m) / z * v(s, c);
        EXPECT_NEAR(got(t, hh * d + c), want, 1e-15 * (1.0 + std::abs(want))) << t << " " << hh;
      }
    }
  // Head 1's rows are nearly all sink: the output goes to ~0, not to a value row.
  EXPECT_LT(std::abs(got(1, 2)), 1e-12);
  const std::vector<double> wrong = {0.0};
  EXPECT_NE(error_of([&] {
              reference::causal_attention(q, k, v, pos, pos, h, 1, d, 0.5, 0, wrong);
            }).find("sinks has 1"),
            std::string::npos);
  const std::vector<double> nan = {0.0, std::nan("")};
  EXPECT_NE(error_of([&] {
              reference::causal_attention(q, k, v, pos, pos, h, 1, d, 0.5, 0, nan);
            }).find("not finite"),
            std::string::npos);
}

// gpt-oss's router: top-k on the logits, softmax over those k only; ties by lower index.
TEST(MoeRouter, TopkThenSoftmax) {
  Matrix l(2, 4);
  l.data = {1.0, 3.0, 3.0, -2.0, 0.5, 0.5, 0.5, 0.5};
  const reference::Routing r = reference::route_topk_softmax(l, 2);
  EXPECT_EQ(r.ids[0], (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.weights[0][0], 0.5);
  EXPECT_EQ(r.weights[0][1], 0.5);
  EXPECT_EQ(r.ids[1], (std::vector<int64_t>{0, 1}));
  Matrix l2(1, 3);
  l2.data = {0.0, 2.0, 1.0};
  const reference::Routing r2 = reference::route_topk_softmax(l2, 2);
  EXPECT_EQ(r2.ids[0], (std::vector<int64_t>{1, 2}));
  const double e = std::exp(-1.0);
  EXPECT_EQ(r2.weights[0][0], 1.0 / (1.0 + e));
  EXPECT_EQ(r2.weights[0][1], e / (1.0 + e));
  Matrix bad(1, 2);
  bad.data = {0.0, INFINITY};
  EXPECT_NE(error_of([&] { reference::route_topk_softmax(bad, 1); }).find("not finite"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::route_topk_softmax(l2, 4); }).find("top_k 4"),
            std::string::npos);
}

// gpt-oss's clamped SwiGLU: gate clamped above, up on both sides, (up + 1) * gate * sigmoid.
TEST(Activation, ClampedSwiglu) {
  Matrix gu(1, 6);
  gu.data = {-3.0, 2.0, 9.0, /*up*/ 0.5, -8.0, 8.0};
  const Matrix y = reference::clamped_swiglu(gu, 1.702, 7.0);
  auto want = [](double g, double u) {
    return (u + 1.0) * (g * (1.0 / (1.0 + std::exp(-(g * 1.702)))));
  };
  EXPECT_EQ(y(0, 0), want(-3.0, 0.5));
  EXPECT_EQ(y(0, 1), want(2.0, -7.0));  // up clamped below: (up + 1) = -6
  EXPECT_EQ(y(0, 2), want(7.0, 7.0));   // gate and up clamped above
  EXPECT_NE(error_of([&] { reference::clamped_swiglu(Matrix(1, 3), 1.0, 1.0); }).find("even"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reference::clamped_swiglu(gu, 1.0, 0.0); }).find("limit"),
            std::string::npos);
}

}  // namespace
}  // namespace qparity::test
