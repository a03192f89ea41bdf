// Comparison metrics of the golden layer (golden/metrics.h): hand-worked values, zero and
// non-finite conventions, llama.cpp-style end-to-end statistics against closed forms and against
// an independent naive long double implementation, and router flips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "error_of.h"
#include "golden/metrics.h"
#include "test_seed.h"

namespace qparity::golden {
namespace {

using test::error_of;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- compare_point ---------------------------------------------------------------------------

TEST(ComparePoint, HandWorkedSmallTensor) {
  // g = [[1, 2], [3, 4]], c = [[1, 2], [3, 5]]: d = e_3, ||g||^2 = 30, ||c||^2 = 39, <c,g> = 34.
  const std::vector<double> g = {1, 2, 3, 4}, c = {1, 2, 3, 5};
  const PointStats s = compare_point(g, c, 2, 2);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.worst_index, 3);
  EXPECT_EQ(s.max_rel, 0.25);
  EXPECT_EQ(s.rel_undefined, 0);
  EXPECT_DOUBLE_EQ(s.rel_l2, std::sqrt(1.0 / 30));
  EXPECT_DOUBLE_EQ(s.nmse, 1.0 / 30);
  EXPECT_DOUBLE_EQ(s.cosine, 34 / std::sqrt(39.0 * 30));
  EXPECT_DOUBLE_EQ(s.deepgemm_diff, 1.0 / 69);  // 1 - 68/69
  EXPECT_DOUBLE_EQ(s.sqnr_db, 10 * std::log10(30.0));
  ASSERT_EQ(s.row_rel_l2.size(), 2u);
  EXPECT_EQ(s.row_rel_l2[0], 0.0);
  EXPECT_DOUBLE_EQ(s.row_rel_l2[1], 0.2);  // 1 / ||[3, 4]||
  EXPECT_EQ(s.first_nonfinite, -1);
  EXPECT_EQ(s.nan_golden + s.inf_golden + s.nan_candidate + s.inf_candidate, 0);
  EXPECT_FALSE(s.integer_codes);
  EXPECT_EQ(s.mismatches, 0);
}

TEST(ComparePoint, NegatedCandidateAndFirstOfTiedWorst) {
  const std::vector<double> g = {1, -2, 2}, c = {-1, 2, -2};
  const PointStats s = compare_point(g, c, 1, 3);
  EXPECT_EQ(s.cosine, -1.0);
  EXPECT_DOUBLE_EQ(s.deepgemm_diff, 2.0);
  EXPECT_DOUBLE_EQ(s.rel_l2, 2.0);
  EXPECT_EQ(s.max_abs, 4.0);
  EXPECT_EQ(s.worst_index, 1);  // |d| = 2, 4, 4: first of the tie
  EXPECT_EQ(s.max_rel, 2.0);
  EXPECT_DOUBLE_EQ(s.sqnr_db, 10 * std::log10(9.0 / 36));
}

TEST(ComparePoint, IdenticalInputs) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 10.0);
  std::vector<double> g(6 * 7);
  for (double& x : g)
    x = nd(rng);
  const PointStats s = compare_point(g, g, 6, 7);
  EXPECT_EQ(s.sqnr_db, kInf);
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.max_rel, 0.0);
  EXPECT_EQ(s.rel_l2, 0.0);
  EXPECT_EQ(s.nmse, 0.0);
  EXPECT_EQ(s.cosine, 1.0);
  EXPECT_EQ(s.deepgemm_diff, 0.0);
  EXPECT_EQ(s.worst_index, -1);  // nothing differs
  EXPECT_THAT(s.row_rel_l2, ::testing::Each(0.0));
  EXPECT_EQ(s.row_rel_l2.size(), 6u);
}

TEST(ComparePoint, ZeroConventions) {
  const std::vector<double> z = {0, 0, 0}, c = {1, -1, 1};
  const PointStats both = compare_point(z, z, 1, 3);
  EXPECT_EQ(both.rel_l2, 0.0);
  EXPECT_EQ(both.cosine, 1.0);
  EXPECT_EQ(both.deepgemm_diff, 0.0);
  EXPECT_EQ(both.sqnr_db, kInf);
  EXPECT_EQ(both.rel_undefined, 0);

  const PointStats golden_zero = compare_point(z, c, 1, 3);
  EXPECT_EQ(golden_zero.rel_l2, kInf);
  EXPECT_EQ(golden_zero.nmse, kInf);
  EXPECT_EQ(golden_zero.cosine, 0.0);
  EXPECT_EQ(golden_zero.deepgemm_diff, 1.0);
  EXPECT_EQ(golden_zero.sqnr_db, -kInf);
  EXPECT_EQ(golden_zero.max_rel, 0.0);  // no element with g != 0
  EXPECT_EQ(golden_zero.rel_undefined, 3);
  EXPECT_EQ(golden_zero.max_abs, 1.0);
  EXPECT_EQ(golden_zero.worst_index, 0);
  ASSERT_EQ(golden_zero.row_rel_l2.size(), 1u);
  EXPECT_EQ(golden_zero.row_rel_l2[0], kInf);

  const PointStats cand_zero = compare_point(c, z, 1, 3);
  EXPECT_EQ(cand_zero.cosine, 0.0);
  EXPECT_EQ(cand_zero.rel_l2, 1.0);
  EXPECT_EQ(cand_zero.sqnr_db, 0.0);

  const PointStats empty = compare_point({}, {}, 0, 5);
  EXPECT_EQ(empty.count, 0);
  EXPECT_TRUE(empty.row_rel_l2.empty());
  EXPECT_EQ(empty.sqnr_db, kInf);
}

// A value finite on one side only is an unbounded error: no norm may call the tensor close
// (issue: an all-NaN point showed rel_l2 0, cosine 1, SQNR inf).
TEST(ComparePoint, NonFiniteElementsAreCountedAndMakeTheErrorInfinite) {
  const std::vector<double> g = {1, kNaN, 3, kInf, 5, 6}, c = {1, 2, -kInf, 4, kNaN, 6};
  const PointStats s = compare_point(g, c, 2, 3);
  EXPECT_EQ(s.nan_golden, 1);
  EXPECT_EQ(s.inf_golden, 1);
  EXPECT_EQ(s.nan_candidate, 1);
  EXPECT_EQ(s.inf_candidate, 1);
  EXPECT_EQ(s.first_nonfinite, 1);
  EXPECT_EQ(s.nonfinite_mismatches, 4);
  EXPECT_EQ(s.worst_index, 1);
  EXPECT_EQ(s.rel_l2, kInf);
  EXPECT_EQ(s.nmse, kInf);
  EXPECT_EQ(s.max_abs, kInf);
  EXPECT_EQ(s.sqnr_db, -kInf);
  EXPECT_TRUE(std::isnan(s.cosine));
  EXPECT_TRUE(std::isnan(s.deepgemm_diff));
  EXPECT_EQ(s.row_rel_l2, (std::vector<double>{kInf, kInf}));
  EXPECT_EQ(s.median_row_rel_l2, kInf);

  // An all-NaN candidate: every norm says so.
  const std::vector<double> g2 = {1, 2, 3, 4}, c2(4, kNaN);
  const PointStats t = compare_point(g2, c2, 2, 2);
  EXPECT_EQ(t.nan_candidate, 4);
  EXPECT_EQ(t.rel_l2, kInf);
  EXPECT_EQ(t.sqnr_db, -kInf);
  EXPECT_FALSE(t.cosine >= 0.5);

  // One NaN: its row and column are infinitely wrong, the others measured as usual.
  const std::vector<double> g3 = {1, 2, 3, 4}, c3 = {1, 2, 3, kNaN};
  const PointStats u = compare_point(g3, c3, 2, 2);
  EXPECT_EQ(u.row_rel_l2[0], 0.0);
  EXPECT_EQ(u.row_rel_l2[1], kInf);
  EXPECT_EQ(u.col_rel_l2[0], 0.0);
  EXPECT_EQ(u.col_rel_l2[1], kInf);
  EXPECT_EQ(u.worst_col, 1);
  EXPECT_EQ(u.worst_index, 3);

  // The same non-finite value on both sides is no difference (it is still counted).
  const std::vector<double> g4 = {kNaN, kInf, 1}, c4 = {kNaN, kInf, 1};
  const PointStats w = compare_point(g4, c4, 1, 3);
  EXPECT_EQ(w.nonfinite_mismatches, 0);
  EXPECT_EQ(w.rel_l2, 0.0);
  EXPECT_EQ(w.nan_candidate + w.inf_candidate, 2);
}

TEST(ComparePoint, HugeValuesDoNotOverflowTheSums) {
  const std::vector<double> g = {1e300, 1e300}, c = {1e300, 1.1e300};
  const PointStats s = compare_point(g, c, 1, 2);
  EXPECT_NEAR(s.rel_l2, 0.1e300 / std::sqrt(2.0) / 1e300, 1e-12);
  EXPECT_TRUE(std::isfinite(s.cosine));
  EXPECT_TRUE(std::isfinite(s.sqnr_db));
}

TEST(ComparePoint, IntegerCodeMismatches) {
  const std::vector<double> g = {0, 1, 2, 3, 4, 5}, c = {0, 1, 7, 3, 4, 6};
  const PointStats s = compare_point(g, c, 2, 3, true);
  EXPECT_TRUE(s.integer_codes);
  EXPECT_EQ(s.mismatches, 2);
  EXPECT_EQ(s.max_abs, 5.0);
  EXPECT_EQ(s.worst_index, 2);
  EXPECT_EQ(compare_point(g, c, 2, 3, false).mismatches, 0);
  EXPECT_EQ(compare_point(g, g, 2, 3, true).mismatches, 0);
}

TEST(ComparePoint, SizeMismatchNamesTheSizes) {
  const std::vector<double> five(5), six(6);
  const std::string m = error_of([&] { compare_point(five, six, 2, 3); });
  EXPECT_THAT(m, HasSubstr("compare_point"));
  EXPECT_THAT(m, HasSubstr("golden has 5"));
  EXPECT_THAT(m, HasSubstr("candidate has 6"));
  EXPECT_THAT(m, HasSubstr("2 x 3 = 6"));
  EXPECT_THAT(error_of([&] { compare_point(six, five, 2, 3); }), HasSubstr("candidate has 5"));
  EXPECT_THAT(error_of([&] { compare_point(six, six, -2, -3); }), HasSubstr("negative shape"));
}

// ---- compare_logits / target_nll -------------------------------------------------------------

std::vector<double> random_logits(std::mt19937_64& rng, int64_t rows, int64_t vocab, double scale) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> v(static_cast<size_t>(rows * vocab));
  for (double& x : v)
    x = nd(rng);
  return v;
}

TEST(CompareLogits, IdenticalLogits) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 8, vocab = 50;
  const std::vector<double> g = random_logits(rng, rows, vocab, 4.0);
  const std::vector<int64_t> t = {3, 7, 0, 49, 12, 5, 1, -1};
  const EndToEnd e = compare_logits(g, g, rows, vocab, t);
  EXPECT_EQ(e.positions, rows);
  EXPECT_EQ(e.scored, rows - 1);
  ASSERT_EQ(e.kld.size(), static_cast<size_t>(rows));
  for (double k : e.kld)
    EXPECT_LT(std::fabs(k), 1e-15);
  EXPECT_LT(std::fabs(e.kld_mean.value), 1e-15);
  EXPECT_LT(std::fabs(e.kld_max), 1e-15);
  EXPECT_EQ(e.top1.value, 1.0);
  EXPECT_EQ(e.first_greedy_divergence, -1);
  EXPECT_EQ(e.dp_rms, 0.0);
  EXPECT_EQ(e.dln_ppl.value, 0.0);
  EXPECT_EQ(e.dln_ppl.lo, 0.0);
  EXPECT_EQ(e.dln_ppl.hi, 0.0);
  EXPECT_EQ(e.ppl_ratio.value, 1.0);
  EXPECT_EQ(e.ppl_golden, e.ppl_candidate);
  EXPECT_GT(e.ppl_golden, 1.0);
}

TEST(CompareLogits, HandComputedTwoPositionsThreeTokens) {
  // Row 0: P uniform, Q = [1, 2, 3]/6.  Row 1: P = [1, 1, 2]/4, Q uniform.
  const double l2 = std::log(2.0), l3 = std::log(3.0);
  const std::vector<double> g = {0, 0, 0, 0, 0, l2};
  const std::vector<double> c = {0, l2, l3, 0, 0, 0};
  const std::vector<int64_t> t = {2, 0};
  const EndToEnd e = compare_logits(g, c, 2, 3, t);

  const double k0 = std::log(4.0 / 3) / 3;  // (1/3)(ln 2 + ln 1 + ln(2/3))
  const double k1 = std::log(9.0 / 8) / 2;  // (1/2) ln(3/4) + (1/2) ln(3/2)
  ASSERT_EQ(e.kld.size(), 2u);
  EXPECT_NEAR(e.kld[0], k0, 1e-15);
  EXPECT_NEAR(e.kld[1], k1, 1e-15);
  EXPECT_NEAR(e.kld_mean.value, (k0 + k1) / 2, 1e-15);
  // n = 2: s = sqrt(var / 1) with var = ((k0 - k1) / 2)^2.
  EXPECT_NEAR(e.kld_mean.hi - e.kld_mean.value, 1.96 * (k0 - k1) / 2, 1e-15);
  EXPECT_NEAR(e.kld_mean.value - e.kld_mean.lo, 1.96 * (k0 - k1) / 2, 1e-15);
  EXPECT_NEAR(e.kld_median, (k0 + k1) / 2, 1e-15);
  EXPECT_NEAR(e.kld_p90, 0.1 * k1 + 0.9 * k0, 1e-15);
  EXPECT_NEAR(e.kld_max, k0, 1e-15);

  // Targets: nll_g = [ln 3, ln 4], nll_c = [ln 2, ln 3].
  EXPECT_EQ(e.scored, 2);
  const double a = std::log(2.0 / 3), b = std::log(3.0 / 4);
  EXPECT_NEAR(e.dln_ppl.value, -l2 / 2, 1e-15);
  EXPECT_NEAR(e.dln_ppl.hi - e.dln_ppl.value, 1.96 * std::fabs(a - b) / 2, 1e-15);
  EXPECT_NEAR(e.ppl_golden, std::sqrt(12.0), 1e-14);
  EXPECT_NEAR(e.ppl_candidate, std::sqrt(6.0), 1e-14);
  EXPECT_NEAR(e.ppl_ratio.value, 1 / std::sqrt(2.0), 1e-15);
  EXPECT_NEAR(e.ppl_ratio.lo, std::exp(e.dln_ppl.lo), 1e-15);
  EXPECT_NEAR(e.ppl_ratio.hi, std::exp(e.dln_ppl.hi), 1e-15);
  // dp = q(t) - p(t) = [1/2 - 1/3, 1/3 - 1/4] = [1/6, 1/12].
  EXPECT_NEAR(e.dp_rms, std::sqrt(5.0 / 288), 1e-15);
  // Argmax, lowest index on ties: golden [0, 2], candidate [2, 0].
  EXPECT_EQ(e.top1.value, 0.0);
  EXPECT_EQ(e.first_greedy_divergence, 0);

  const std::vector<double> nll = target_nll(g, 2, 3, t);
  ASSERT_EQ(nll.size(), 2u);
  EXPECT_NEAR(nll[0], l3, 1e-15);
  EXPECT_NEAR(nll[1], std::log(4.0), 1e-15);
  const std::vector<double> nll_c = target_nll(c, 2, 3, std::vector<int64_t>{2, -1});
  EXPECT_NEAR(nll_c[0], l2, 1e-15);
  EXPECT_TRUE(std::isnan(nll_c[1]));
}

TEST(CompareLogits, ShiftedByConstantIsTheSameDistribution) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 6, vocab = 40;
  const std::vector<double> g = random_logits(rng, rows, vocab, 3.0);
  std::vector<double> c = g;
  for (double& x : c)
    x += 123.456;
  const std::vector<int64_t> t = {0, 1, 2, 3, 4, 5};
  const EndToEnd e = compare_logits(g, c, rows, vocab, t);
  for (double k : e.kld)
    EXPECT_LT(std::fabs(k), 1e-12);
  EXPECT_EQ(e.top1.value, 1.0);
  EXPECT_LT(std::fabs(e.dln_ppl.value), 1e-12);
  EXPECT_LT(e.dp_rms, 1e-12);
  EXPECT_NEAR(e.ppl_candidate, e.ppl_golden, 1e-10 * e.ppl_golden);

  // A large offset: the inputs themselves round (ulp(1e6) ~ 1e-10), so the true KL of what was
  // passed is O(1e-20); computing from max-subtracted logits must not add offset * 2^-64 noise.
  for (double& x : c)
    x += 1e6;
  const EndToEnd far = compare_logits(g, c, rows, vocab, t);
  for (double k : far.kld)
    EXPECT_LT(std::fabs(k), 1e-16);
}

TEST(CompareLogits, SwappedTopTwoAtPositionOne) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 5, vocab = 10;
  const std::vector<double> g = random_logits(rng, rows, vocab, 2.0);  // ties have probability 0
  std::vector<double> c = g;
  double* row1 = c.data() + vocab;
  const int64_t top = std::max_element(row1, row1 + vocab) - row1;
  int64_t second = top == 0 ? 1 : 0;
  for (int64_t j = 0; j < vocab; ++j) {
    if (j != top && row1[j] > row1[second]) second = j;
  }
  std::swap(row1[top], row1[second]);
  const EndToEnd e = compare_logits(g, c, rows, vocab, std::vector<int64_t>(5, -1));
  EXPECT_EQ(e.first_greedy_divergence, 1);
  EXPECT_DOUBLE_EQ(e.top1.value, (rows - 1.0) / rows);
  EXPECT_GT(e.kld[1], 0.0);
  EXPECT_EQ(e.kld[0], 0.0);
  EXPECT_EQ(e.kld[2], 0.0);
  EXPECT_EQ(e.scored, 0);
  EXPECT_TRUE(std::isnan(e.dp_rms));
  EXPECT_TRUE(std::isnan(e.ppl_ratio.value));
}

TEST(CompareLogits, WilsonIntervalNineOfTen) {
  // 10 positions, the argmax flips at position 7 only.
  std::vector<double> g(10 * 2, 0.0);
  for (int r = 0; r < 10; ++r)
    g[static_cast<size_t>(2 * r)] = 1.0;
  std::vector<double> c = g;
  std::swap(c[14], c[15]);
  const EndToEnd e = compare_logits(g, c, 10, 2, std::vector<int64_t>(10, 0));
  EXPECT_EQ(e.first_greedy_divergence, 7);
  EXPECT_DOUBLE_EQ(e.top1.value, 0.9);
  EXPECT_NEAR(e.top1.lo, 0.596, 5e-4);
  EXPECT_NEAR(e.top1.hi, 0.982, 5e-4);

  const Interval w = wilson_interval(9, 10);
  EXPECT_EQ(w.lo, e.top1.lo);
  EXPECT_EQ(w.hi, e.top1.hi);
  const Interval all = wilson_interval(10, 10);
  EXPECT_EQ(all.value, 1.0);
  EXPECT_NEAR(all.hi, 1.0, 1e-15);
  EXPECT_NEAR(all.lo, 0.7225, 5e-5);  // 10 / (10 + 1.96^2)
  EXPECT_EQ(wilson_interval(0, 10).lo, 0.0);
  EXPECT_TRUE(std::isnan(wilson_interval(0, 0).value));
  EXPECT_THAT(error_of([] { wilson_interval(3, 2); }), HasSubstr("wilson_interval"));
}

TEST(CompareLogits, SinglePositionHasADegenerateInterval) {
  const std::vector<double> g = {0, 1, 2}, c = {0, 2, 1};
  const EndToEnd e = compare_logits(g, c, 1, 3, std::vector<int64_t>{1});
  EXPECT_GT(e.kld_mean.value, 0.0);
  EXPECT_EQ(e.kld_mean.lo, e.kld_mean.value);
  EXPECT_EQ(e.kld_mean.hi, e.kld_mean.value);
  EXPECT_EQ(e.dln_ppl.lo, e.dln_ppl.value);
  EXPECT_EQ(e.kld_median, e.kld[0]);
  EXPECT_EQ(e.kld_p999, e.kld[0]);
}

// An independent naive version: log-sum-exp without max subtraction, all in long double, and
// llama.cpp's sum / sum-of-squares uncertainty formula instead of the two-pass one.
struct Naive {
  std::vector<long double> kld;
  long double kld_mean = 0, kld_sd = 0, dnll_mean = 0, dnll_sd = 0, dp_rms = 0;
  long double nll_g = 0, nll_c = 0;
  int64_t agree = 0, scored = 0, first_div = -1;
};

Naive naive(const std::vector<double>& g, const std::vector<double>& c, int64_t rows, int64_t vocab,
            const std::vector<int64_t>& t) {
  Naive n;
  long double k1 = 0, k2 = 0, d1 = 0, d2 = 0, dp2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = g.data() + r * vocab;
    const double* y = c.data() + r * vocab;
    long double sx = 0, sy = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      sx += std::exp(static_cast<long double>(x[j]));
      sy += std::exp(static_cast<long double>(y[j]));
    }
    const long double lx = std::log(sx), ly = std::log(sy);
    long double kl = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const long double lp = x[j] - lx, lq = y[j] - ly;
      kl += std::exp(lp) * (lp - lq);
    }
    n.kld.push_back(kl);
    k1 += kl;
    k2 += kl * kl;
    const int64_t ax = std::max_element(x, x + vocab) - x;  // first maximum
    const int64_t ay = std::max_element(y, y + vocab) - y;
    if (ax == ay) {
      ++n.agree;
    } else if (n.first_div < 0) {
      n.first_div = r;
    }
    const int64_t tok = t[static_cast<size_t>(r)];
    if (tok < 0) continue;
    const long double ng = lx - x[tok], nc = ly - y[tok];
    n.nll_g += ng;
    n.nll_c += nc;
    d1 += nc - ng;
    d2 += (nc - ng) * (nc - ng);
    dp2 += (std::exp(-nc) - std::exp(-ng)) * (std::exp(-nc) - std::exp(-ng));
    ++n.scored;
  }
  const long double nr = static_cast<long double>(rows), ns = static_cast<long double>(n.scored);
  n.kld_mean = k1 / nr;
  n.kld_sd = std::sqrt((k2 / nr - n.kld_mean * n.kld_mean) / (nr - 1));
  n.dnll_mean = d1 / ns;
  n.dnll_sd = std::sqrt((d2 / ns - n.dnll_mean * n.dnll_mean) / (ns - 1));
  n.dp_rms = std::sqrt(dp2 / ns);
  n.nll_g /= ns;
  n.nll_c /= ns;
  return n;
}

TEST(CompareLogits, RandomAgainstNaiveLongDouble) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 41, vocab = 97;
  const std::vector<double> g = random_logits(rng, rows, vocab, 3.0);
  std::vector<double> c = g;
  std::normal_distribution<double> noise(0.0, 0.3);
  for (double& x : c)
    x += noise(rng);
  std::uniform_int_distribution<int64_t> tok(-1, vocab - 1);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t& x : t)
    x = tok(rng);
  t[0] = -1;  // at least one unscored row
  t[1] = 5;   // and at least two scored ones
  t[2] = 0;

  const EndToEnd e = compare_logits(g, c, rows, vocab, t);
  const Naive n = naive(g, c, rows, vocab, t);
  const double tol = 1e-13;
  ASSERT_EQ(e.kld.size(), n.kld.size());
  for (size_t r = 0; r < e.kld.size(); ++r) {
    EXPECT_NEAR(e.kld[r], static_cast<double>(n.kld[r]), tol) << "row " << r;
  }
  EXPECT_NEAR(e.kld_mean.value, static_cast<double>(n.kld_mean), tol);
  EXPECT_NEAR(e.kld_mean.hi, static_cast<double>(n.kld_mean + 1.96L * n.kld_sd), tol);
  EXPECT_NEAR(e.kld_mean.lo, static_cast<double>(n.kld_mean - 1.96L * n.kld_sd), tol);
  EXPECT_EQ(e.scored, n.scored);
  EXPECT_NEAR(e.dln_ppl.value, static_cast<double>(n.dnll_mean), tol);
  EXPECT_NEAR(e.dln_ppl.hi, static_cast<double>(n.dnll_mean + 1.96L * n.dnll_sd), tol);
  EXPECT_NEAR(e.dp_rms, static_cast<double>(n.dp_rms), tol);
  EXPECT_NEAR(std::log(e.ppl_golden), static_cast<double>(n.nll_g), tol);
  EXPECT_NEAR(std::log(e.ppl_candidate), static_cast<double>(n.nll_c), tol);
  EXPECT_NEAR(std::log(e.ppl_ratio.value), static_cast<double>(n.nll_c - n.nll_g), tol);
  EXPECT_DOUBLE_EQ(e.top1.value, static_cast<double>(n.agree) / rows);
  EXPECT_EQ(e.first_greedy_divergence, n.first_div);

  // llama.cpp's explicit median (odd count: the middle value) and its interpolated percentiles.
  std::vector<long double> sorted = n.kld;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NEAR(e.kld_median, static_cast<double>(sorted[20]), tol);
  EXPECT_NEAR(e.kld_max, static_cast<double>(sorted[40]), tol);
  EXPECT_NEAR(e.kld_p90, static_cast<double>(sorted[36]), tol);  // h = 0.9 * 40 = 36
  const long double h99 = 0.99L * 40 - 39;                       // h = 39.6
  EXPECT_NEAR(e.kld_p99, static_cast<double>((1 - h99) * sorted[39] + h99 * sorted[40]), tol);

  const std::vector<double> nll = target_nll(g, rows, vocab, t);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = t[static_cast<size_t>(r)];
    if (k < 0) {
      EXPECT_TRUE(std::isnan(nll[static_cast<size_t>(r)]));
      continue;
    }
    long double s = 0;
    for (int64_t j = 0; j < vocab; ++j)
      s += std::exp(static_cast<long double>(g[r * vocab + j]));
    EXPECT_NEAR(nll[static_cast<size_t>(r)], static_cast<double>(std::log(s) - g[r * vocab + k]),
                tol);
  }
}

TEST(CompareLogits, BadInputIsAnError) {
  std::vector<double> g(4 * 3, 0.0), c(4 * 3, 0.0);
  const std::vector<int64_t> t = {0, 1, 2, -1};
  EXPECT_THAT(error_of([&] {
                compare_logits(g, c, 4, 3, std::vector<int64_t>{0, 3, 0, 0});
              }),
              HasSubstr("targets[1] = 3 is outside [0, 3)"));
  EXPECT_THAT(error_of([&] {
                target_nll(g, 4, 3, std::vector<int64_t>{0, 0, -2, 0});
              }),
              HasSubstr("targets[2] = -2"));
  EXPECT_THAT(error_of([&] {
                compare_logits(g, c, 4, 3, std::vector<int64_t>{0, 0});
              }),
              HasSubstr("targets has 2 entries"));
  EXPECT_THAT(error_of([&] { compare_logits(g, std::vector<double>(11), 4, 3, t); }),
              HasSubstr("candidate logits has 11"));
  EXPECT_THAT(error_of([&] {
                target_nll(g, 3, 3, std::vector<int64_t>{0, 0, 0});
              }),
              HasSubstr("logits has 12 elements, expected 3 x 3 = 9"));
}

// NaN/Inf logits are measured, not an error: the row is infinitely wrong, and the judge fails it
// (issue: NaN logits ended as exit 1 "bad input" from compare_logits).
TEST(CompareLogits, NonFiniteRowsAreInfinitelyWrong) {
  std::vector<double> g(4 * 3, 0.0), c(4 * 3, 0.0);
  const std::vector<int64_t> t = {0, 1, 2, -1};
  c[1 * 3 + 1] = kNaN;
  g[2 * 3] = -kInf;
  const EndToEnd e = compare_logits(g, c, 4, 3, t);
  EXPECT_EQ(e.nonfinite_candidate_rows, 1);
  EXPECT_EQ(e.nonfinite_golden_rows, 1);
  EXPECT_EQ(e.first_nonfinite_row, 1);
  EXPECT_EQ(e.kld[0], 0.0);
  EXPECT_EQ(e.kld[1], kInf);
  EXPECT_EQ(e.kld[2], kInf);
  EXPECT_EQ(e.kld_mean.value, kInf);
  EXPECT_EQ(e.kld_mean.hi, kInf);
  EXPECT_EQ(e.kld_max, kInf);
  EXPECT_DOUBLE_EQ(e.top1.value, 0.5);  // rows 0 and 3 agree
  EXPECT_EQ(e.first_greedy_divergence, 1);
  EXPECT_EQ(e.dln_ppl.hi, kInf);
  const std::vector<double> nll = target_nll(c, 4, 3, t);
  EXPECT_TRUE(std::isnan(nll[1]));  // no distribution in a NaN row
  EXPECT_FALSE(std::isnan(nll[0]));
}

TEST(CompareLogits, NoRows) {
  const EndToEnd e = compare_logits({}, {}, 0, 7, std::span<const int64_t>{});
  EXPECT_EQ(e.positions, 0);
  EXPECT_TRUE(e.kld.empty());
  EXPECT_TRUE(std::isnan(e.kld_mean.value));
  EXPECT_TRUE(std::isnan(e.top1.value));
  EXPECT_EQ(e.first_greedy_divergence, -1);
}

// ---- percentile --------------------------------------------------------------------------------

TEST(Percentile, LinearInterpolationBetweenClosestRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_EQ(percentile(v, 0.0), 1.0);
  EXPECT_EQ(percentile(v, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 2.5);  // even count: mean of the two middle values
  EXPECT_DOUBLE_EQ(percentile(v, 0.9), 3.7);  // h = 2.7
  EXPECT_DOUBLE_EQ(percentile({5, 1, 3}, 0.5), 3.0);
  EXPECT_EQ(percentile({7}, 0.999), 7.0);
  EXPECT_THAT(error_of([] { percentile({}, 0.5); }), HasSubstr("no values"));
  EXPECT_THAT(error_of([] { percentile({1, 2}, 1.5); }), HasSubstr("outside [0, 1]"));
  EXPECT_THAT(error_of([] { percentile({1, kNaN}, 0.5); }), HasSubstr("NaN"));
}

// ---- compare_router ----------------------------------------------------------------------------

TEST(CompareRouter, SetSemantics) {
  const std::vector<double> g = {1, 2, 3, 4, 5, 6, 7, 0};
  const std::vector<double> c = {2, 1, 3, 5, 6, 5, 0, 7};  // token 1 flips; order is ignored
  const RouterFlips f = compare_router(g, c, 4, 2);
  EXPECT_EQ(f.tokens, 4);
  EXPECT_EQ(f.flipped, 1);
  EXPECT_EQ(f.first_flip, 1);
  EXPECT_DOUBLE_EQ(f.flip_rate, 0.25);
  EXPECT_EQ(f.changed_ids, 1);  // token 1: expert 4 became 5

  const RouterFlips same = compare_router(g, g, 4, 2);
  EXPECT_EQ(same.flipped, 0);
  EXPECT_EQ(same.first_flip, -1);
  EXPECT_EQ(same.flip_rate, 0.0);

  // Repeated ids (e.g. -1 padding) compare as multisets.
  const std::vector<double> pad_g = {3, -1, -1}, pad_c = {-1, 3, 3};
  EXPECT_EQ(compare_router(pad_g, pad_c, 1, 3).flipped, 1);
  EXPECT_EQ(compare_router(pad_g, pad_c, 1, 3).changed_ids, 1);  // one -1 became a second 3
  EXPECT_EQ(compare_router(pad_g, std::vector<double>{-1, -1, 3}, 1, 3).flipped, 0);

  EXPECT_TRUE(std::isnan(compare_router({}, {}, 0, 8).flip_rate));
}

TEST(CompareRouter, NonIntegerIdsAreFlipsAndSizesAreErrors) {
  const std::vector<double> g = {1, 2, 3, 4};
  const RouterFlips a = compare_router(g, std::vector<double>{1, 2, 3.5, 4}, 2, 2);
  EXPECT_EQ(a.flipped, 1);
  EXPECT_EQ(a.first_flip, 1);
  EXPECT_EQ(a.invalid_ids, 1);
  EXPECT_EQ(a.changed_ids, 1);
  const RouterFlips b = compare_router(g, std::vector<double>{kNaN, kNaN, 3, 4}, 2, 2);
  EXPECT_EQ(b.flipped, 1);
  EXPECT_EQ(b.changed_ids, 2);
  const RouterFlips c = compare_router(std::vector<double>{1, kNaN, 3, 4}, g, 2, 2);
  EXPECT_EQ(c.flipped, 1);
  EXPECT_EQ(c.invalid_ids, 1);
  EXPECT_THAT(error_of([&] {
                compare_router(g, std::vector<double>{1, 2, 3}, 2, 2);
              }),
              HasSubstr("candidate ids has 3"));
}

// ---- align_expert_outputs ----------------------------------------------------------------------

TEST(AlignExpertOutputs, SlotOrderIsIgnoredAndFlipsAreLeftOut) {
  // 2 tokens, top-2, width 2. Token 0: golden experts (3, 1), candidate (1, 3) - same set, other
  // order; expert 3's output is off by (0, 1). Token 1: golden (1, 0), candidate (1, 2) - expert 0
  // flipped to 2: that slot is zeroed on both sides; expert 1 matches exactly.
  const std::vector<double> gi = {3, 1, 1, 0}, ci = {1, 3, 1, 2};
  const std::vector<double> g = {/*t0 e3*/ 1, 2, /*t0 e1*/ 5, 6,
                                 /*t1 e1*/ 7, 8, /*t1 e0*/ 9, 9};
  const std::vector<double> c = {/*t0 e1*/ 5, 6, /*t0 e3*/ 1, 3,
                                 /*t1 e1*/ 7, 8, /*t1 e2*/ 4, 4};
  const ExpertAlignment a = align_expert_outputs(g, c, gi, ci, 2, 2, 2);
  EXPECT_EQ(a.matched, 3);
  EXPECT_EQ(a.unmatched, 1);
  EXPECT_EQ(a.golden, (std::vector<double>{1, 2, 5, 6, 7, 8, 0, 0}));
  EXPECT_EQ(a.candidate, (std::vector<double>{1, 3, 5, 6, 7, 8, 0, 0}));
  ASSERT_EQ(a.experts.size(), 2u);  // experts 1 and 3: expert 0 never matched
  EXPECT_EQ(a.experts[0].expert, 1);
  EXPECT_EQ(a.experts[0].pairs, 2);
  EXPECT_EQ(a.experts[0].rel_l2, 0.0);
  EXPECT_EQ(a.experts[1].expert, 3);
  EXPECT_EQ(a.experts[1].pairs, 1);
  EXPECT_NEAR(a.experts[1].rel_l2, 1 / std::sqrt(5.0), 1e-15);
  EXPECT_EQ(a.experts[1].max_abs, 1.0);
}

TEST(AlignExpertOutputs, RepeatedIdsPairOnceAndNaNIsKept) {
  // Padding id -1 twice on both sides pairs slot by slot; a NaN stays visible in max_abs.
  const std::vector<double> gi = {-1, -1}, ci = {-1, -1};
  const std::vector<double> g = {1, 2}, c = {kNaN, 2};
  const ExpertAlignment a = align_expert_outputs(g, c, gi, ci, 1, 2, 1);
  EXPECT_EQ(a.matched, 2);
  ASSERT_EQ(a.experts.size(), 1u);
  EXPECT_EQ(a.experts[0].pairs, 2);
  EXPECT_TRUE(std::isnan(a.experts[0].max_abs));
}

TEST(AlignExpertOutputs, BadShapesAreErrorsAndBadIdsNeverMatch) {
  const std::vector<double> ids = {0, 1}, three = {1, 2, 3}, two = {1, 2}, half = {0, 0.5};
  EXPECT_THAT(error_of([&] { align_expert_outputs(three, three, ids, ids, 1, 2, 2); }),
              HasSubstr("golden outputs"));
  const ExpertAlignment a = align_expert_outputs(two, two, ids, half, 1, 2, 1);
  EXPECT_EQ(a.matched, 1);  // expert 0 pairs; the candidate's 0.5 is no expert
  EXPECT_EQ(a.unmatched, 1);
}

TEST(ComparePointColumns, OneChannelFaultShowsPerColumn) {
  // 3 rows x 4 columns; column 2 of the candidate is 1.25x the golden, the rest exact.
  const std::vector<double> g = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<double> c = g;
  for (int r = 0; r < 3; ++r)
    c[static_cast<size_t>(r * 4 + 2)] *= 1.25;
  const PointStats st = compare_point(g, c, 3, 4);
  ASSERT_EQ(st.col_rel_l2.size(), 4u);
  EXPECT_EQ(st.col_rel_l2[0], 0.0);
  EXPECT_NEAR(st.col_rel_l2[2], 0.25, 1e-15);
  EXPECT_NEAR(st.max_col_rel_l2, 0.25, 1e-15);
  EXPECT_EQ(st.worst_col, 2);
  // Diluted by the other channels: sqrt(0.25^2 (3^2 + 7^2 + 11^2) / (1^2 + ... + 12^2)).
  EXPECT_NEAR(st.rel_l2, std::sqrt(0.0625 * 179.0 / 650.0), 1e-15);
}

TEST(ComparePointRows, MedianRowIsTheLowerMedianOfTheTokenErrors) {
  // 4 rows x 2 columns; rows off by 0, 10 %, 20 %, 30 %: lower median = the 2nd smallest (10 %).
  const std::vector<double> g = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> c = g;
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 2; ++j)
      c[static_cast<size_t>(r * 2 + j)] *= 1.0 + 0.1 * ((r + 3) % 4);  // 30, 0, 10, 20 %
  const PointStats st = compare_point(g, c, 4, 2);
  EXPECT_NEAR(st.median_row_rel_l2, 0.1, 1e-15);
  // One row: its own error; no rows: 0.
  const std::vector<double> g1 = {2, 4}, c1 = {2.2, 4.4}, none;
  EXPECT_NEAR(compare_point(g1, c1, 1, 2).median_row_rel_l2, 0.1, 1e-15);
  EXPECT_EQ(compare_point(none, none, 0, 3).median_row_rel_l2, 0.0);
}

}  // namespace
}  // namespace qparity::golden
