// Exhaustive checks of the small-float codecs: every code, every midpoint between neighbouring
// codes (the ties), the overflow boundary, and >= 10^6 random doubles per format and overflow
// mode, all against the CUDA headers' host conversions; plus the hand-checked values that
// FORMATS.md records from torch / ml_dtypes runs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/codecs/float_format.h"
#include "cuda_codec_peer.h"
#include "test_seed.h"

namespace qparity {
namespace {

using codec::FloatFormat;
using codec::Overflow;

struct Case {
  FloatFormat fmt;
  Overflow overflow;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n(info.param.fmt.name);
  return n + (info.param.overflow == Overflow::kSaturate ? "_sat" : "_nosat");
}

class FloatCodec : public testing::TestWithParam<Case> {};

bool same_double(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);  // also tells -0 from +0
}

// Our code and CUDA's agree: identical bits, or both NaN (NaN payloads and signs differ
// between implementations and are never compared).
::testing::AssertionResult codes_agree(const FloatFormat& f, double x, uint32_t ours,
                                       uint32_t peer) {
  if (ours == peer) return ::testing::AssertionSuccess();
  if (codec::is_nan_code(f, ours) && codec::is_nan_code(f, peer))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << f.name << " encode(" << std::hexfloat << x << std::defaultfloat << " = " << x
         << "): ours 0x" << std::hex << ours << ", CUDA 0x" << peer;
}

TEST_P(FloatCodec, EveryCodeDecodesLikeCudaAndReencodesToItself) {
  const auto [f, o] = GetParam();
  for (uint32_t c = 0; c < f.code_count(); ++c) {
    const double v = codec::decode(f, c);
    ASSERT_TRUE(same_double(v, test::cuda_decode(f, c)))
        << f.name << " code 0x" << std::hex << c << ": ours " << v << " CUDA "
        << test::cuda_decode(f, c);
    const uint32_t back = codec::encode(f, v, o);
    if (codec::is_nan_code(f, c)) {
      ASSERT_TRUE(codec::is_nan_code(f, back)) << "NaN code 0x" << std::hex << c;
    } else if (codec::is_inf_code(f, c) && o == Overflow::kSaturate) {
      ASSERT_EQ(back, (c & f.sign_mask()) | codec::encode(f, codec::max_finite(f), o));
    } else {
      ASSERT_EQ(back, c) << f.name << " code 0x" << std::hex << c << " value " << v;
    }
    ASSERT_TRUE(codes_agree(f, v, back, test::cuda_encode(f, v, o)));
  }
}

// All finite values in increasing order, +-0 once each, plus the first value past the largest
// finite one on the format's extended grid (so the overflow tie is a "midpoint" too).
std::vector<double> ordered_values(const FloatFormat& f) {
  std::vector<double> pos;
  for (uint32_t c = 0; c < f.sign_mask(); ++c) {
    const double v = codec::decode(f, c);
    if (std::isfinite(v)) pos.push_back(v);
  }
  std::sort(pos.begin(), pos.end());
  const double top = pos.back();
  const double ulp_top = top - pos[pos.size() - 2];
  // Next grid point above max: same quantum unless max ends its binade (then the quantum doubles,
  // which the RNE tie at max + ulp/2 does not care about: the midpoint is max + ulp_top / 2).
  pos.push_back(top + ulp_top);
  std::vector<double> all;
  for (auto it = pos.rbegin(); it != pos.rend(); ++it)
    all.push_back(-*it);
  all.insert(all.end(), pos.begin() + 1, pos.end());  // skip the duplicate 0
  return all;
}

TEST_P(FloatCodec, EveryMidpointAndItsNeighboursAgreeWithCuda) {
  const auto [f, o] = GetParam();
  const auto vals = ordered_values(f);
  size_t checked = 0;
  for (size_t i = 0; i + 1 < vals.size(); ++i) {
    const double mid = (vals[i] + vals[i + 1]) / 2;  // exact: one extra bit fits in a double
    ASSERT_EQ(mid - vals[i], vals[i + 1] - mid);
    for (double x : {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)}) {
      ASSERT_TRUE(codes_agree(f, x, codec::encode(f, x, o), test::cuda_encode(f, x, o)));
      ++checked;
    }
  }
  EXPECT_GE(checked, 3 * (f.code_count() / 2));
}

TEST_P(FloatCodec, MillionRandomDoublesAgreeWithCuda) {
  const auto [f, o] = GetParam();
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const double lo = codec::min_subnormal(f) / 8, hi = codec::max_finite(f) * 4;
  std::uniform_real_distribution<double> log_span(std::log2(lo), std::log2(hi));
  std::uniform_real_distribution<double> sub_span(0.0, 2 * codec::min_normal(f));
  std::uniform_int_distribution<uint32_t> code_dist(0, f.code_count() - 1);
  const std::vector<double> specials = {0.0,
                                        -0.0,
                                        INFINITY,
                                        -INFINITY,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        -std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::denorm_min(),
                                        -std::numeric_limits<double>::max(),
                                        1e300,
                                        -1e-300};
  for (int i = 0; i < 1'000'000; ++i) {
    double x = 0;
    switch (i % 5) {
      case 0:
        x = std::bit_cast<double>(rng());
        break;  // any double: NaN, inf, huge, tiny
      case 1:
        x = std::exp2(log_span(rng));
        break;  // the format's whole range and beyond
      case 2:
        x = sub_span(rng);
        break;   // the subnormal range
      case 3: {  // within a few double ulps of a code value
        const double v = codec::decode(f, code_dist(rng));
        x = std::isfinite(v) ? v * (1 + std::ldexp(static_cast<double>(rng() % 64) - 32, -52)) : v;
        break;
      }
      case 4:
        x = specials[rng() % specials.size()];
        break;
    }
    if (rng() & 1) x = -x;
    const uint32_t ours = codec::encode(f, x, o);
    ASSERT_TRUE(codes_agree(f, x, ours, test::cuda_encode(f, x, o))) << "draw " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FloatCodec,
                         testing::Values(Case{codec::kBF16, Overflow::kNonSaturating},
                                         Case{codec::kBF16, Overflow::kSaturate},
                                         Case{codec::kFP16, Overflow::kNonSaturating},
                                         Case{codec::kFP16, Overflow::kSaturate},
                                         Case{codec::kE4M3FN, Overflow::kNonSaturating},
                                         Case{codec::kE4M3FN, Overflow::kSaturate},
                                         Case{codec::kE5M2, Overflow::kNonSaturating},
                                         Case{codec::kE5M2, Overflow::kSaturate},
                                         Case{codec::kE2M1, Overflow::kSaturate}),
                         case_name);

// Values FORMATS.md records from torch 2.11 / ml_dtypes runs (Appendix A, 1.1-1.5).
TEST(FloatCodecKnownValues, E4M3FN) {
  using codec::double_to_e4m3fn;
  const auto nosat = Overflow::kNonSaturating, sat = Overflow::kSaturate;
  EXPECT_EQ(double_to_e4m3fn(464.0, nosat), 0x7E);  // tie -> even mantissa 110 = 448
  EXPECT_EQ(double_to_e4m3fn(464.0001, nosat), 0x7F);
  EXPECT_EQ(double_to_e4m3fn(470.0, nosat), 0x7F);
  EXPECT_EQ(double_to_e4m3fn(480.0, nosat), 0x7F);
  EXPECT_EQ(double_to_e4m3fn(INFINITY, nosat), 0x7F);
  EXPECT_EQ(double_to_e4m3fn(-INFINITY, sat), 0xFE);
  EXPECT_EQ(double_to_e4m3fn(1e9, sat), 0x7E);
  EXPECT_EQ(double_to_e4m3fn(std::ldexp(1.0, -10), nosat), 0x00);  // half the min subnormal
  EXPECT_EQ(double_to_e4m3fn(1.5 * std::ldexp(1.0, -10), nosat), 0x01);
  EXPECT_EQ(double_to_e4m3fn(-1e-30, nosat), 0x80);  // underflow keeps the sign
  EXPECT_EQ(codec::e4m3fn_to_double(0x7E), 448.0);
  EXPECT_EQ(codec::e4m3fn_to_double(0x01), 0.001953125);
  EXPECT_EQ(codec::max_finite(codec::kE4M3FN), 448.0);
}

TEST(FloatCodecKnownValues, E5M2AndHalfFormats) {
  EXPECT_EQ(codec::double_to_e5m2(61439.0, Overflow::kNonSaturating), 0x7B);
  EXPECT_EQ(codec::double_to_e5m2(61440.0, Overflow::kNonSaturating), 0x7C);  // tie -> inf
  EXPECT_EQ(codec::double_to_e5m2(61440.0, Overflow::kSaturate), 0x7B);
  EXPECT_EQ(codec::max_finite(codec::kE5M2), 57344.0);
  EXPECT_EQ(codec::double_to_bf16(1.0 + std::ldexp(1.0, -8)), 0x3F80);  // tie to even
  EXPECT_EQ(codec::double_to_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);
  EXPECT_EQ(codec::double_to_fp16(65519.0), 0x7BFF);
  EXPECT_EQ(codec::double_to_fp16(65520.0), 0x7C00);
  EXPECT_EQ(codec::max_finite(codec::kFP16), 65504.0);
}

TEST(FloatCodecKnownValues, E2M1TieTable) {
  // FORMATS.md 1.3: RNE on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6.
  const std::vector<std::pair<double, double>> cases = {
      {0.25, 0.0}, {0.2500001, 0.5}, {0.75, 1.0}, {1.25, 1.0}, {1.75, 2.0},  {2.5, 2.0},
      {3.5, 4.0},  {5.0, 4.0},       {5.01, 6.0}, {7.0, 6.0},  {100.0, 6.0}, {INFINITY, 6.0}};
  for (auto [x, want] : cases) {
    EXPECT_EQ(codec::e2m1_to_double(codec::double_to_e2m1(x)), want) << x;
    EXPECT_EQ(codec::e2m1_to_double(codec::double_to_e2m1(-x)), -want) << -x;
  }
  EXPECT_EQ(codec::double_to_e2m1(std::nan("")), 0x7);  // CUDA: NaN -> +6
  EXPECT_EQ(codec::double_to_e2m1(-0.1), 0x8);          // -0
}

}  // namespace
}  // namespace qparity
