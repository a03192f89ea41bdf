// Device-side conversions (hardware cvt on sm_90 for fp8 / bf16 / fp16) against the core codecs:
// every code decoded, and encodes of every code value, every midpoint with its float neighbours,
// and 10^6 random floats. Float inputs are exact doubles, so both sides round once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "../unit/test_seed.h"
#include "core/codecs/float_format.h"
#include "core/codecs/ue8m0.h"
#include "gpu_engine/kernels/codec_kernels.h"
#include "gpu_test.h"

namespace qparity {
namespace {

using codec::FloatFormat;
using codec::Overflow;
using gpu::GpuCodec;

class GpuCodecs : public test::GpuTest {};

struct Pair {
  GpuCodec gpu;
  FloatFormat fmt;
  bool saturate;
};

std::vector<float> inputs_for(const FloatFormat& f, uint64_t seed) {
  std::vector<float> xs;
  std::vector<double> vals;
  for (uint32_t c = 0; c < f.code_count(); ++c) {
    const double v = codec::decode(f, c);
    xs.push_back(static_cast<float>(v));
    if (std::isfinite(v)) vals.push_back(v);
  }
  std::sort(vals.begin(), vals.end());
  vals.erase(std::unique(vals.begin(), vals.end()), vals.end());
  vals.push_back(2 * vals.back() - vals[vals.size() - 2]);  // one step past max: overflow tie
  for (size_t i = 0; i + 1 < vals.size(); ++i) {
    const auto mid = static_cast<float>((vals[i] + vals[i + 1]) / 2);  // exact in float here
    for (float m : {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)}) {
      xs.push_back(m);
      xs.push_back(-m);
    }
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 1'000'000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return xs;
}

TEST_F(GpuCodecs, DecodeAndEncodeMatchTheCoreCodecs) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed) + " on " + device_.name + " " + device_.sm());
  const std::vector<Pair> pairs = {
      {GpuCodec::kBF16, codec::kBF16, false},  {GpuCodec::kFP16, codec::kFP16, false},
      {GpuCodec::kE4M3, codec::kE4M3FN, true}, {GpuCodec::kE4M3, codec::kE4M3FN, false},
      {GpuCodec::kE5M2, codec::kE5M2, true},   {GpuCodec::kE5M2, codec::kE5M2, false},
      {GpuCodec::kE2M1, codec::kE2M1, true}};
  for (const auto& p : pairs) {
    SCOPED_TRACE(std::string(p.fmt.name) + (p.saturate ? " satfinite" : " nosat"));
    const auto decoded = gpu::gpu_decode_all_codes(p.gpu);
    for (uint32_t c = 0; c < p.fmt.code_count(); ++c) {
      const double ours = codec::decode(p.fmt, c);
      if (std::isnan(ours)) {
        ASSERT_TRUE(std::isnan(decoded[c])) << "code " << c;
      } else {
        ASSERT_EQ(static_cast<double>(decoded[c]), ours) << "code " << c;
      }
    }
    const auto xs = inputs_for(p.fmt, seed);
    const auto codes = gpu::gpu_encode(p.gpu, xs, p.saturate);
    const Overflow o = p.saturate ? Overflow::kSaturate : Overflow::kNonSaturating;
    size_t mismatches = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint32_t ours = codec::encode(p.fmt, xs[i], o);
      const bool same = ours == codes[i] ||
                        (codec::is_nan_code(p.fmt, ours) && codec::is_nan_code(p.fmt, codes[i]));
      if (!same && mismatches++ < 5)
        ADD_FAILURE() << "x = " << xs[i] << ": ours 0x" << std::hex << ours << " GPU 0x"
                      << codes[i];
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST_F(GpuCodecs, Ue8m0MatchesTheCoreCodec) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<float> xs;
  for (int e = -127; e <= 127; ++e) {
    const float v = std::ldexp(1.0f, e);
    for (float x : {v, 1.5f * v, std::nextafter(v, 0.f), std::nextafter(v, INFINITY)})
      xs.push_back(x);
  }
  for (int i = 0; i < 1'000'000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (bool sat : {true, false}) {
    for (auto [g, r] : {std::pair{GpuCodec::kUE8M0TowardZero, codec::Ue8m0Rounding::kTowardZero},
                        std::pair{GpuCodec::kUE8M0Up, codec::Ue8m0Rounding::kUp}}) {
      const auto codes = gpu::gpu_encode(g, xs, sat);
      size_t bad = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const uint8_t ours =
            codec::double_to_ue8m0(xs[i], r, sat ? Overflow::kSaturate : Overflow::kNonSaturating);
        if (ours != codes[i] && bad++ < 5)
          ADD_FAILURE() << "x = " << xs[i] << ": ours " << int(ours) << " GPU " << codes[i];
      }
      EXPECT_EQ(bad, 0u);
    }
  }
}

}  // namespace
}  // namespace qparity
