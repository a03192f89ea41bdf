// GPTQ and AutoAWQ GEMM layouts (schemes/int/gptq_layout.h, awq_layout.h): the packings against
// independent transcriptions of the producers' own packing loops (AutoGPTQ QuantLinear.pack with
// its 3-bit cross-word branch, AutoAWQ WQLinear_GEMM.from_linear with AWQ_ORDER), the v1 zero
// off-by-one, the refusals, the round-to-nearest quantizers against their formulas, and the
// pack-quantized method loading both layouts (the same numbers as the compressed-tensors layout
// of the same codes).
#include <cmath>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/int/awq_layout.h"
#include "schemes/int/gptq_layout.h"
#include "schemes/int/pack_quantized_int.h"
#include "schemes/method/method_factory.h"

namespace qparity::reference {
namespace {

using ::testing::HasSubstr;

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

QuantArgs int_args(int bits, int64_t group, bool sym, bool actorder = false) {
  IntWeightPoint p;
  p.bits = bits;
  p.group = group;
  p.symmetric = sym;
  p.actorder = actorder;
  return packed_int_args(p);
}

// A random IntWeight: unsigned codes u in [0, 2^b), zero points z in [lo_z, 2^b) (sym: 2^b-1),
// fp16-exact scales, groups in column order or a random act-order permutation.
IntWeight random_weight(int64_t n, int64_t k, int bits, int64_t gsize, bool sym, bool actorder,
                        std::mt19937& rng, int64_t lo_z = 0) {
  const int64_t half = int64_t{1} << (bits - 1), maxq = 2 * half - 1;
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / gsize;
  std::uniform_int_distribution<int64_t> code(0, maxq), zero(lo_z, maxq);
  std::uniform_int_distribution<int> mant(1024, 2047), ex(-12, -3);
  w.q.resize(sz(n * k));
  for (auto& q : w.q)
    q = code(rng) - half;
  w.zero.resize(sz(n * w.groups));
  for (auto& z : w.zero)
    z = sym ? 0 : zero(rng) - half;
  w.scales = Matrix(n, w.groups);
  for (auto& s : w.scales.data)
    s = std::ldexp(static_cast<double>(mant(rng)), ex(rng) - 10);  // exact in fp16
  std::vector<int64_t> perm(sz(k));
  for (int64_t c = 0; c < k; ++c)
    perm[sz(c)] = c;
  if (actorder) std::shuffle(perm.begin(), perm.end(), rng);
  w.group.resize(sz(k));
  for (int64_t j = 0; j < k; ++j)
    w.group[sz(perm[sz(j)])] = j / gsize;
  return w;
}

TensorMap::mapped_type* find(TensorMap& m, const std::string& n) {
  auto it = m.find(n);
  return it == m.end() ? nullptr : &it->second;
}

IntWeight decode_gptq_map(TensorMap& m, const QuantArgs& a, GptqZeroFormat f, int64_t n,
                          int64_t k) {
  return decode_gptq([&](const std::string& x) -> const HostTensor* { return find(m, x); },
                     [](const std::string& x) { return "t." + x; }, a, f, n, k);
}

IntWeight decode_awq_map(TensorMap& m, const QuantArgs& a, int64_t n, int64_t k) {
  return decode_awq([&](const std::string& x) -> const HostTensor* { return find(m, x); },
                    [](const std::string& x) { return "t." + x; }, a, n, k);
}

void expect_same(const IntWeight& a, const IntWeight& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.zero, b.zero);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.scales.data, b.scales.data);
}

// AutoGPTQ QuantLinear.pack, transcribed loop for loop (qweight from intweight [K, N] of
// unsigned codes; the same loop over N packs qzeros): the independent peer of the bit stream.
std::vector<uint32_t> autogptq_pack(const std::vector<uint32_t>& v, int bits) {
  std::vector<uint32_t> out(v.size() * bits / 32, 0);
  size_t i = 0, row = 0;
  while (row < out.size()) {
    if (bits == 2 || bits == 4 || bits == 8) {
      for (size_t j = i; j < i + 32 / bits; ++j)
        out[row] |= v[j] << (bits * (j - i));
      i += 32 / bits;
      row += 1;
    } else {  // bits == 3
      for (size_t j = i; j < i + 10; ++j)
        out[row] |= v[j] << (3 * (j - i));
      i += 10;
      out[row] |= v[i] << 30;
      row += 1;
      out[row] |= (v[i] >> 2) & 1;
      i += 1;
      for (size_t j = i; j < i + 10; ++j)
        out[row] |= v[j] << (3 * (j - i) + 1);
      i += 10;
      out[row] |= v[i] << 31;
      row += 1;
      out[row] |= (v[i] >> 1) & 0x3;
      i += 1;
      for (size_t j = i; j < i + 10; ++j)
        out[row] |= v[j] << (3 * (j - i) + 2);
      i += 10;
      row += 1;
    }
  }
  return out;
}

TEST(GptqLayout, PackingIsAutoGptqsLoopForEveryWidth) {
  std::mt19937 rng(7);
  for (int bits : {2, 3, 4, 8}) {
    SCOPED_TRACE(bits);
    const int64_t n = 32, k = 64, g = 32;
    const IntWeight w = random_weight(n, k, bits, g, false, false, rng, 1);
    TensorMap m = encode_gptq(w, bits, GptqZeroFormat::kV1, DType::kF16, "t");
    const auto qw = decode_ints(m.at("qweight").view(), "qweight");
    const int64_t half = int64_t{1} << (bits - 1);
    const int64_t kw = k * bits / 32;
    ASSERT_EQ(m.at("qweight").shape, (std::vector<int64_t>{kw, n}));
    for (int64_t c = 0; c < n; ++c) {
      std::vector<uint32_t> col(sz(k));
      for (int64_t r = 0; r < k; ++r)
        col[sz(r)] = static_cast<uint32_t>(w.q[sz(c * k + r)] + half);
      const auto want = autogptq_pack(col, bits);
      for (int64_t i = 0; i < kw; ++i)
        ASSERT_EQ(static_cast<uint32_t>(qw[sz(i * n + c)]), want[sz(i)]) << "column " << c;
    }
    // qzeros: AutoGPTQ's `zeros -= 1` then the same loop along N.
    const auto qz = decode_ints(m.at("qzeros").view(), "qzeros");
    for (int64_t gi = 0; gi < w.groups; ++gi) {
      std::vector<uint32_t> row(sz(n));
      for (int64_t c = 0; c < n; ++c)
        row[sz(c)] = static_cast<uint32_t>(w.zero[sz(c * w.groups + gi)] + half - 1);
      const auto want = autogptq_pack(row, bits);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(static_cast<uint32_t>(qz[sz(gi) * want.size() + i]), want[i]) << "group " << gi;
    }
  }
}

TEST(GptqLayout, SymmetricV1ZerosAreTheKnownWords) {
  // 0x77777777 (int4), 0x7F7F7F7F (int8), 0x55555555 (int2): z = 2^(b-1) stored as z - 1.
  std::mt19937 rng(1);
  const std::map<int, uint32_t> word = {{4, 0x77777777u}, {8, 0x7F7F7F7Fu}, {2, 0x55555555u}};
  for (const auto& [bits, expect] : word) {
    const IntWeight w = random_weight(32, 32, bits, 32, true, false, rng);
    TensorMap m = encode_gptq(w, bits, GptqZeroFormat::kV1, DType::kF16, "t");
    for (int64_t v : decode_ints(m.at("qzeros").view(), "qzeros"))
      EXPECT_EQ(static_cast<uint32_t>(v), expect) << bits;
    TensorMap m2 = encode_gptq(w, bits, GptqZeroFormat::kV2, DType::kF16, "t");
    for (int64_t v : decode_ints(m2.at("qzeros").view(), "qzeros"))
      EXPECT_EQ(static_cast<uint32_t>(v), expect + (bits == 4   ? 0x11111111u
                                                    : bits == 8 ? 0x01010101u
                                                                : 0x55555555u))
          << bits;
  }
}

TEST(GptqLayout, RoundTripsEveryPointBitForBit) {
  std::mt19937 rng(3);
  for (int bits : {2, 3, 4, 8})
    for (int64_t g : {int64_t{32}, int64_t{64}, int64_t{-1}})
      for (bool sym : {true, false})
        for (bool act : {false, true})
          for (auto f : {GptqZeroFormat::kV1, GptqZeroFormat::kV2}) {
            if (act && g == -1) continue;
            SCOPED_TRACE(std::to_string(bits) + " g" + std::to_string(g) +
                         (sym ? " sym" : " asym") + (act ? " act" : "") +
                         (f == GptqZeroFormat::kV1 ? " v1" : " v2"));
            const int64_t n = 64, k = 128, gs = g == -1 ? k : g;
            const IntWeight w =
                random_weight(n, k, bits, gs, sym, act, rng, f == GptqZeroFormat::kV1 ? 1 : 0);
            TensorMap m = encode_gptq(w, bits, f, DType::kF16, "t");
            const QuantArgs a = int_args(bits, g == -1 ? IntWeightPoint::kChannel : g, sym, act);
            const IntWeight back = decode_gptq_map(m, a, f, n, k);
            expect_same(back, w);
            // The formula, from the tensors' own fields.
            const Matrix d = dequantize(back);
            for (int64_t r = 0; r < n; r += 7)
              for (int64_t c = 0; c < k; c += 5) {
                const int64_t gi = w.group[sz(c)];
                EXPECT_EQ(d(r, c),
                          static_cast<double>(w.q[sz(r * k + c)] - w.zero[sz(r * w.groups + gi)]) *
                              w.scales(r, gi));
              }
          }
}

TEST(GptqLayout, RefusesWhatHasNoSingleMeaning) {
  std::mt19937 rng(5);
  const QuantArgs sym4 = int_args(4, 32, true), asym4 = int_args(4, 32, false);
  // A sym checkpoint whose qzeros are not 2^(b-1): Marlin ignores them, the other kernels do not.
  {
    IntWeight w = random_weight(32, 64, 4, 32, false, false, rng, 1);
    w.zero[0] = 3;
    TensorMap m = encode_gptq(w, 4, GptqZeroFormat::kV1, DType::kF16, "t");
    EXPECT_THAT([&] { decode_gptq_map(m, sym4, GptqZeroFormat::kV1, 32, 64); },
                ::testing::ThrowsMessage<Error>(HasSubstr("in a sym checkpoint")));
  }
  // v1 cannot store z = 0 (writer), and a stored all-ones field is its spilled -1 (reader).
  {
    IntWeight w = random_weight(32, 64, 4, 32, false, false, rng, 1);
    w.zero[5] = -8;  // z = 0
    EXPECT_THAT([&] { encode_gptq(w, 4, GptqZeroFormat::kV1, DType::kF16, "t"); },
                ::testing::ThrowsMessage<Error>(HasSubstr("write gptq_v2")));
    TensorMap m = encode_gptq(w, 4, GptqZeroFormat::kV2, DType::kF16, "t");
    // The same bytes read as v1: field 0 of a word is 0 -> z = 1; make one field 15 instead.
    auto words = decode_ints(m.at("qzeros").view(), "qzeros");
    words[0] |= 0xF;
    m["qzeros"] = encode_ints(DType::kI32, m.at("qzeros").shape, words, "qzeros");
    EXPECT_THAT([&] { decode_gptq_map(m, asym4, GptqZeroFormat::kV1, 32, 64); },
                ::testing::ThrowsMessage<Error>(HasSubstr("zero points are corrupt")));
  }
  // g_idx out of column order without desc_act: vLLM ignores it, AutoGPTQ does not.
  {
    const IntWeight w = random_weight(32, 64, 4, 32, true, true, rng);
    TensorMap m = encode_gptq(w, 4, GptqZeroFormat::kV1, DType::kF16, "t");
    EXPECT_THAT([&] { decode_gptq_map(m, sym4, GptqZeroFormat::kV1, 32, 64); },
                ::testing::ThrowsMessage<Error>(HasSubstr("desc_act is false")));
  }
  // Wrong shape, NaN scale, unequal act-order groups.
  {
    const IntWeight w = random_weight(32, 64, 4, 32, true, false, rng);
    TensorMap m = encode_gptq(w, 4, GptqZeroFormat::kV1, DType::kF16, "t");
    EXPECT_THAT([&] { decode_gptq_map(m, sym4, GptqZeroFormat::kV1, 40, 64); },
                ::testing::ThrowsMessage<Error>(HasSubstr("t.qweight")));
    TensorMap bad = m;
    bad.at("scales").bytes[6] = 0x00;  // element 3 (F16, little-endian) := 0x7E00, a NaN
    bad.at("scales").bytes[7] = 0x7E;
    EXPECT_THAT([&] { decode_gptq_map(bad, sym4, GptqZeroFormat::kV1, 32, 64); },
                ::testing::ThrowsMessage<Error>(HasSubstr("t.scales")));
    TensorMap act = m;
    std::vector<int64_t> gi(64, 0);
    act["g_idx"] = encode_ints(DType::kI32, {64}, gi, "g");
    EXPECT_THAT(
        [&] { decode_gptq_map(act, int_args(4, 32, true, true), GptqZeroFormat::kV1, 32, 64); },
        ::testing::ThrowsMessage<Error>(HasSubstr("has 64 columns")));
  }
}

TEST(GptqLayout, RoundToNearestIsGptqsQuantizer) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0, 0.02);
  const int64_t n = 8, k = 64, g = 32;
  Matrix x(n, k);
  for (auto& v : x.data)
    v = std::ldexp(std::round(std::ldexp(nd(rng), 14)), -14);  // bf16-ish values
  for (bool sym : {true, false}) {
    const IntWeight w = quantize_gptq_rtn(x, 4, g, sym, {}, DType::kF16, true, "x");
    for (int64_t r = 0; r < n; ++r)
      for (int64_t gi = 0; gi < k / g; ++gi) {
        double mn = 0, mx = 0;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
          mn = std::min(mn, x(r, c));
          mx = std::max(mx, x(r, c));
        }
        if (sym) {
          mx = std::max(-mn, mx);
          if (mn < 0) mn = -mx;
        }
        const double s = (mx - mn) / 15.0;
        // The stored scale is the fp16 value nearest the exact one.
        EXPECT_NEAR(w.scales(r, gi), s, s * 1e-3);
        const int64_t z = sym ? 8 : static_cast<int64_t>(std::nearbyint(-mn / s));
        EXPECT_EQ(w.zero[sz(r * (k / g) + gi)] + 8, z);
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
          const double t = std::nearbyint(x(r, c) / w.scales(r, gi));
          EXPECT_EQ(w.q[sz(r * k + c)] + 8,
                    std::clamp<int64_t>(static_cast<int64_t>(t) + z, 0, 15));
        }
      }
  }
}

// AutoAWQ WQLinear_GEMM.from_linear's packing loop: nibble i of word (k, col) is column
// col*8 + order_map[i].
TEST(AwqLayout, PackingIsAutoAwqsOrderAndRoundTrips) {
  std::mt19937 rng(13);
  const int64_t n = 64, k = 128, g = 64;
  const IntWeight w = random_weight(n, k, 4, g, false, false, rng);
  TensorMap m = encode_awq(w, 4, DType::kF16, "t");
  ASSERT_EQ(m.at("qweight").shape, (std::vector<int64_t>{k, n / 8}));
  ASSERT_EQ(m.at("qzeros").shape, (std::vector<int64_t>{k / g, n / 8}));
  ASSERT_EQ(m.at("scales").shape, (std::vector<int64_t>{k / g, n}));
  const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  const auto qw = decode_ints(m.at("qweight").view(), "qweight");
  for (int64_t r = 0; r < k; ++r)
    for (int64_t col = 0; col < n / 8; ++col) {
      uint32_t want = 0;
      for (int i = 0; i < 8; ++i)
        want |= static_cast<uint32_t>(w.q[sz((col * 8 + order_map[i]) * k + r)] + 8) << (4 * i);
      ASSERT_EQ(static_cast<uint32_t>(qw[sz(r * n / 8 + col)]), want);
    }
  // vLLM's reverse order unpacks column 8c + j from nibble [0, 4, 1, 5, 2, 6, 3, 7][j].
  const int reverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const auto qz = decode_ints(m.at("qzeros").view(), "qzeros");
  for (int64_t gi = 0; gi < k / g; ++gi)
    for (int64_t c = 0; c < n; ++c) {
      const auto word = static_cast<uint32_t>(qz[sz(gi * n / 8 + c / 8)]);
      EXPECT_EQ(static_cast<int64_t>((word >> (4 * reverse[c % 8])) & 0xF),
                w.zero[sz(c * (k / g) + gi)] + 8);
    }
  expect_same(decode_awq_map(m, int_args(4, g, false), n, k), w);
  EXPECT_THAT([&] { decode_awq_map(m, int_args(4, g, true), n, k); },
              ::testing::ThrowsMessage<Error>(HasSubstr("zero_point")));
  EXPECT_THAT([&] { decode_awq_map(m, int_args(8, g, false), n, k); },
              ::testing::ThrowsMessage<Error>(HasSubstr("4-bit")));
}

TEST(AwqLayout, RoundToNearestIsAutoAwqsPseudoQuantize) {
  std::mt19937 rng(17);
  std::normal_distribution<double> nd(0.01, 0.02);
  const int64_t n = 8, k = 64, g = 32;
  Matrix x(n, k);
  for (auto& v : x.data)
    v = std::ldexp(std::round(std::ldexp(nd(rng), 14)), -14);
  const IntWeight w = quantize_awq_rtn(x, 4, g, false, DType::kF16, true, "x");
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < k / g; ++gi) {
      double mn = x(r, gi * g), mx = mn;  // AWQ: the group's own range, not widened to 0
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
        mn = std::min(mn, x(r, c));
        mx = std::max(mx, x(r, c));
      }
      const double s = std::max(mx - mn, 1e-5) / 15.0;
      EXPECT_NEAR(w.scales(r, gi), s, s * 1e-3);
      const int64_t z = std::clamp<int64_t>(-static_cast<int64_t>(std::nearbyint(mn / s)), 0, 15);
      EXPECT_EQ(w.zero[sz(r * (k / g) + gi)] + 8, z);
    }
}

// The method reads both layouts as the same numbers as the compressed-tensors layout of the
// same codes: apply and dequantized_weight agree exactly.
TEST(ProducerIntLayouts, LoadAsThePackQuantizedMethodOfTheSameCodes) {
  std::mt19937 rng(19);
  const int64_t n = 64, k = 128, g = 32;
  struct Case {
    std::string format;
    bool sym, act;
  };
  for (const Case& cs : {Case{"gptq", true, true}, Case{"gptq_v2", false, false},
                         Case{"gptq", false, true}, Case{"awq", false, false}}) {
    SCOPED_TRACE(cs.format);
    const IntWeight w = random_weight(n, k, 4, g, cs.sym, cs.act, rng, 1);
    TensorMap files =
        cs.format == "awq"
            ? encode_awq(w, 4, DType::kF16, "t")
            : encode_gptq(w, 4, cs.format == "gptq" ? GptqZeroFormat::kV1 : GptqZeroFormat::kV2,
                          DType::kF16, "t");
    MethodConfig c;
    c.scheme = SchemeId{.kind = SchemeKind::kPackedInt,
                        .int_weights = IntWeightPoint{4, g, cs.sym, cs.act}};
    c.weights = int_args(4, g, cs.sym, cs.act);
    c.format = cs.format;
    const Matrix d = dequantize_linear(c, files, n, k, DType::kBF16);
    EXPECT_EQ(d.data, dequantize(w).data);
    // vLLM copies the fp16 scales into bf16 parameters of a bf16 model.
    c.dialect = Dialect::kVllm;
    IntWeight rounded = w;
    for (double& v : rounded.scales.data)
      v = in(Arith::kBf16, v);
    const Matrix dv = dequantize_linear(c, files, n, k, DType::kBF16);
    EXPECT_EQ(dv.data, dequantize(rounded).data);
    EXPECT_NE(dv.data, d.data);
  }
}

}  // namespace
}  // namespace qparity::reference
