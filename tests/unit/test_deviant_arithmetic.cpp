// The deviations' own ops (reference_cpu/models/deviant_arithmetic.h) at fp64 precision are the
// reference's ops bit for bit, so a deviation differs from the reference only by the roundings
// it states; and at bf16 they round where they say.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/config/model_config.h"
#include "core/error.h"
#include "reference_cpu/layers/attention.h"
#include "reference_cpu/layers/rms_norm.h"
#include "reference_cpu/layers/rope.h"
#include "reference_cpu/models/deviant_arithmetic.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/method/method_factory.h"

namespace qparity::reference {
namespace {

Matrix random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  Matrix m(rows, cols);
  for (double& v : m.data)
    v = d(rng);
  return m;
}

bool all_bf16(const Matrix& m) {
  for (double v : m.data)
    if (in(Arith::kBf16, v) != v) return false;
  return true;
}

TEST(DeviantArithmetic, NormsAtFp64AreTheReferencesAndRoundWhereTheySay) {
  const Matrix x = random_matrix(5, 64, 1);
  std::vector<double> w(64), b(64);
  for (size_t j = 0; j < w.size(); ++j)
    w[j] = 0.5 + 0.01 * static_cast<double>(j), b[j] = 0.001 * static_cast<double>(j);
  const Matrix ref = rms_norm(x, w, 1e-6, b);
  EXPECT_EQ(rms_norm_in(x, w, 1e-6, b, Arith::kFp64).data, ref.data);
  EXPECT_EQ(rms_norm_two_roundings(x, w, 1e-6, b, Arith::kFp64).data, ref.data);
  const Matrix two = rms_norm_two_roundings(x, w, 1e-6, {}, Arith::kBf16);
  EXPECT_TRUE(all_bf16(two));
  // Two roundings differ from one rounding of the fp64 norm on some elements, by <= 2 ULPs.
  const Matrix one = rms_norm(x, w, 1e-6);
  int differ = 0;
  for (size_t i = 0; i < one.data.size(); ++i) {
    const double r = in(Arith::kBf16, one.data[i]);
    differ += r != two.data[i];
    EXPECT_LE(std::abs(r - two.data[i]), std::abs(r) * 0x1p-6);
  }
  EXPECT_GT(differ, 0);
  EXPECT_TRUE(all_bf16(rms_norm_in(x, w, 1e-6, {}, Arith::kBf16)));
}

TEST(DeviantArithmetic, RotaryAndAttentionAtFp64AreTheReferences) {
  ModelConfig cfg;
  cfg.head_dim = 16;
  cfg.rope_theta = 10000.0;
  const Rope rope(cfg);
  const int64_t heads = 2, t = 6;
  std::vector<int64_t> pos(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    pos[static_cast<size_t>(i)] = i;
  const Matrix x = random_matrix(t, heads * 16, 2);
  Matrix a = x, b = x;
  rope.apply(a, heads, pos);
  rotate_half_in(rope, b, heads, pos, Arith::kFp64);
  EXPECT_EQ(a.data, b.data);
  Matrix c = x;
  rotate_half_in(rope, c, heads, pos, Arith::kBf16);
  EXPECT_TRUE(all_bf16(c));
  // Interleaved pairs rotate (2i, 2i + 1): a pair's norm is kept, and position 0 is unchanged.
  Matrix p = x;
  rotate_pairs_interleaved(rope, p, heads, pos);
  for (int64_t j = 0; j < heads * 16; ++j)
    EXPECT_EQ(p(0, j), x(0, j));
  EXPECT_NEAR(std::hypot(p(3, 0), p(3, 1)), std::hypot(x(3, 0), x(3, 1)), 1e-12);
  EXPECT_NE(p(3, 0), a(3, 0));

  const Matrix q = random_matrix(t, heads * 16, 3), k = random_matrix(t, 16, 4),
               v = random_matrix(t, 16, 5);
  const Matrix ref = causal_attention(q, k, v, pos, pos, heads, 1, 16, 0.25);
  EXPECT_EQ(
      attention_variant(q, k, v, pos, pos, heads, 1, 16, 0.25, false, false, Arith::kFp64).data,
      ref.data);
  // Without the max, in fp32: the same to fp32 rounding at these scores.
  const Matrix no_max =
      attention_variant(q, k, v, pos, pos, heads, 1, 16, 0.25, true, false, Arith::kFp64);
  for (size_t i = 0; i < ref.data.size(); ++i)
    EXPECT_NEAR(no_max.data[i], ref.data[i], 1e-5);
}

TEST(DeviantArithmetic, AccumulationAtFp64IsTheMethodsOwnAndBf16RoundsEveryStep) {
  const int64_t n = 8, kk = 256;
  QuantizeRequest req;
  req.weight = random_matrix(n, kk, 6);
  for (double& v : req.weight.data)
    v = in(Arith::kBf16, v * 0.05);
  const SchemeId id = parse_scheme_id("w8a16-ch");
  auto m = make_linear_method(LinearShape::dense("l", n, kk), method_config(id, Dialect::kIdeal));
  m->load_all(quantize_linear(id, req));
  m->process_weights_after_loading();
  const Matrix x = random_matrix(3, kk, 7);
  const Matrix y = m->apply(x);
  const auto same = accumulate_linear(*m, x, Arith::kFp64);
  ASSERT_TRUE(same);
  EXPECT_EQ(same->data, y.data);
  const auto f32 = accumulate_linear(*m, x, Arith::kFp32);
  const auto b16 = accumulate_linear(*m, x, Arith::kBf16);
  ASSERT_TRUE(f32 && b16);
  double e32 = 0, e16 = 0, norm = 0;
  for (size_t i = 0; i < y.data.size(); ++i) {
    e32 += std::pow(f32->data[i] - y.data[i], 2);
    e16 += std::pow(b16->data[i] - y.data[i], 2);
    norm += y.data[i] * y.data[i];
  }
  // fp32 accumulation over K = 256: ~1e-7 relative; bf16: ~1e-2 (every step rounded to 8 bits).
  EXPECT_LT(std::sqrt(e32 / norm), 1e-5);
  EXPECT_GT(std::sqrt(e16 / norm), 1e-3);
}

}  // namespace
}  // namespace qparity::reference
