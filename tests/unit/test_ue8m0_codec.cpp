// UE8M0: every byte decodes as CUDA decodes it; toward-zero and round-up encodes agree with
// CUDA's __nv_cvt_double_to_e8m0 on every code value, every midpoint and 10^6 random doubles;
// round-to-nearest reproduces the torch run recorded in FORMATS.md 1.4.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/codecs/ue8m0.h"
#include "cuda_codec_peer.h"
#include "test_seed.h"

namespace qparity {
namespace {

using codec::Overflow;
using codec::Ue8m0Rounding;

double cuda_e8m0_decode(uint8_t b) {
  const __nv_bfloat16_raw r = __nv_cvt_e8m0_to_bf16raw(b);
  return static_cast<double>(__bfloat162float(__nv_bfloat16(r)));
}

uint8_t cuda_e8m0_encode(double x, Ue8m0Rounding r, Overflow o) {
  return __nv_cvt_double_to_e8m0(x, o == Overflow::kSaturate ? __NV_SATFINITE : __NV_NOSAT,
                                 r == Ue8m0Rounding::kUp ? cudaRoundPosInf : cudaRoundZero);
}

TEST(Ue8m0, EveryByteDecodesLikeCuda) {
  for (int b = 0; b < 256; ++b) {
    const double ours = codec::ue8m0_to_double(static_cast<uint8_t>(b));
    const double peer = cuda_e8m0_decode(static_cast<uint8_t>(b));
    if (b == 0xFF) {
      EXPECT_TRUE(std::isnan(ours) && std::isnan(peer));
    } else {
      EXPECT_EQ(ours, std::ldexp(1.0, b - 127));
      EXPECT_EQ(ours, peer) << "byte " << b;
    }
  }
}

class Ue8m0VsCuda : public testing::TestWithParam<std::tuple<Ue8m0Rounding, Overflow>> {};

TEST_P(Ue8m0VsCuda, CodesMidpointsAndRandomDoubles) {
  const auto [r, o] = GetParam();
  auto check = [&](double x) {
    const uint8_t ours = codec::double_to_ue8m0(x, r, o);
    const uint8_t peer = cuda_e8m0_encode(x, r, o);
    return ours == peer ? ::testing::AssertionSuccess()
                        : ::testing::AssertionFailure()
                              << "encode(" << std::hexfloat << x << std::defaultfloat << "): ours "
                              << int(ours) << ", CUDA " << int(peer);
  };
  for (int b = 0; b < 255; ++b) {
    const double v = std::ldexp(1.0, b - 127);
    for (double x : {v, 1.5 * v, std::nextafter(v, 0.0), std::nextafter(v, INFINITY),
                     std::nextafter(1.5 * v, 0.0), std::nextafter(1.5 * v, INFINITY)}) {
      ASSERT_TRUE(check(x));
      ASSERT_TRUE(check(-x));
    }
  }
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  // Half the draws span the format's range and beyond it on both sides, half are any double.
  std::uniform_real_distribution<double> log_span(-160.0, 140.0);
  for (int i = 0; i < 1'000'000; ++i) {
    const double x = (i % 2) ? std::exp2(log_span(rng)) : std::bit_cast<double>(rng());
    ASSERT_TRUE(check(x)) << "draw " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, Ue8m0VsCuda,
    testing::Combine(testing::Values(Ue8m0Rounding::kTowardZero, Ue8m0Rounding::kUp),
                     testing::Values(Overflow::kSaturate, Overflow::kNonSaturating)));

TEST(Ue8m0, NearestMatchesTorchRun) {
  const auto n = Ue8m0Rounding::kNearest;
  const auto nosat = Overflow::kNonSaturating;
  EXPECT_EQ(codec::double_to_ue8m0(2.9, n, nosat), 0x80);
  EXPECT_EQ(codec::double_to_ue8m0(3.0, n, nosat), 0x81);  // tie goes up
  EXPECT_EQ(codec::double_to_ue8m0(3.1, n, nosat), 0x81);
  EXPECT_EQ(codec::double_to_ue8m0(0.0, n, nosat), 0x00);
  EXPECT_EQ(codec::double_to_ue8m0(-1.0, n, nosat), 0x7F);  // sign dropped
  EXPECT_EQ(codec::double_to_ue8m0(std::ldexp(1.0, -128), n, nosat), 0x00);
  EXPECT_EQ(codec::double_to_ue8m0(INFINITY, n, nosat), 0xFF);
  EXPECT_EQ(codec::double_to_ue8m0(std::nan(""), n, nosat), 0xFF);
  EXPECT_EQ(codec::double_to_ue8m0(INFINITY, n, Overflow::kSaturate), 0xFE);
  EXPECT_EQ(codec::double_to_ue8m0(std::ldexp(1.0, 200), n, Overflow::kSaturate), 0xFE);
  EXPECT_EQ(codec::double_to_ue8m0(std::ldexp(1.0, 200), n, nosat), 0xFF);
  EXPECT_EQ(codec::double_to_ue8m0(std::ldexp(1.0, 200), Ue8m0Rounding::kTowardZero, nosat), 0xFE);
}

TEST(Ue8m0, ExponentIsExactForEveryPowerAndNeighbour) {
  for (int e = -127; e <= 127; ++e) {
    const double v = std::ldexp(1.0, e);
    const auto z = Ue8m0Rounding::kTowardZero, up = Ue8m0Rounding::kUp;
    EXPECT_EQ(codec::double_to_ue8m0(v, z, Overflow::kSaturate), e + 127);
    EXPECT_EQ(codec::double_to_ue8m0(v, up, Overflow::kSaturate), e + 127);
    if (e < 127) {
      EXPECT_EQ(codec::double_to_ue8m0(std::nextafter(v, INFINITY), up, Overflow::kSaturate),
                e + 128);
    }
    if (e > -127) {
      EXPECT_EQ(codec::double_to_ue8m0(std::nextafter(v, 0.0), z, Overflow::kSaturate), e + 126);
    }
  }
}

}  // namespace
}  // namespace qparity
