// The shared machinery under every scheme: dialect names, rounding primitives, fp32/bf16
// emulation, checkpoint-tensor encoding, the exact scaled GEMM and the LinearMethod lifecycle
// (through the unquantized scheme, the simplest complete one).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>

#include "core/codecs/float_format.h"
#include "error_of.h"
#include "quant_test_util.h"
#include "schemes/description/dialect.h"
#include "schemes/kv/kv_cache_method.h"
#include "schemes/math/matmul.h"
#include "schemes/math/numeric.h"
#include "schemes/math/scaled_gemm.h"
#include "schemes/method/host_tensor.h"
#include "schemes/method/parallel.h"
#include "schemes/method/unquantized.h"
#include "test_seed.h"

namespace qparity::reference {
namespace {

using test::error_of;
using ::testing::HasSubstr;

TEST(Dialect, NamesRoundTripAndUnknownListsValid) {
  for (Dialect d : kAllDialects)
    EXPECT_EQ(parse_dialect(to_string(d)), d);
  EXPECT_EQ(parse_dialect("CT"), Dialect::kCompressedTensors);
  EXPECT_EQ(parse_dialect("SGLang"), Dialect::kSglang);
  const auto msg = error_of([] { parse_dialect("tensorrt"); });
  EXPECT_THAT(msg, HasSubstr("tensorrt"));
  EXPECT_THAT(msg, HasSubstr("ideal, compressed-tensors, vllm, sglang, msmodelslim"));
}

TEST(Numeric, IntegerRoundingRules) {
  // FORMATS.md 1.6: torch.round / cvt.rni are half-even, libdevice.round half-away, .to(int8)
  // truncates.
  const double ties[] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5};
  const double even[] = {0, 2, 2, -0, -2, -2};
  const double away[] = {1, 2, 3, -1, -2, -3};
  const double trunc[] = {0, 1, 2, -0, -1, -2};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(round_int(ties[i], IntRound::kHalfEven), even[i]) << ties[i];
    EXPECT_EQ(round_int(ties[i], IntRound::kHalfAway), away[i]) << ties[i];
    EXPECT_EQ(round_int(ties[i], IntRound::kTowardZero), trunc[i]) << ties[i];
  }
  EXPECT_EQ(quantize_int(200.7, IntRound::kHalfEven, -128, 127), 127);
  EXPECT_EQ(quantize_int(-300.0, IntRound::kHalfAway, -128, 127), -128);
  EXPECT_EQ(quantize_int(-127.5, IntRound::kHalfEven, -128, 127), -128);  // RNE: -128 is even
  EXPECT_EQ(quantize_int(127.5, IntRound::kHalfEven, -128, 127), 127);    // clamped first
}

TEST(Numeric, Fp32EmulationIsIeeeSingle) {
  // 1/3 in fp32 is 0x3EAAAAAB = 0.3333333432674407958984375.
  EXPECT_EQ(div_in(Arith::kFp32, 1.0, 3.0), 0.3333333432674407958984375);
  // x/s and x*(1/s) differ in fp32 for x = 5, s = 3: 5/3 rounds to 0x3FD55555 = 1.66666663;
  // 1/3 rounds to 0x3EAAAAAB, and 5 * 0x3EAAAAAB rounds up to 0x3FD55556 = 1.66666675.
  const double q_div = apply_scale(5.0, 3.0, ScaleUse::kDivide, Arith::kFp32);
  const double q_mul = apply_scale(5.0, 3.0, ScaleUse::kMultiplyReciprocal, Arith::kFp32);
  EXPECT_EQ(q_div, 1.66666662693023681640625);
  EXPECT_EQ(q_mul, 1.66666674613952636718750);
  // In fp64 both forms are within one fp64 ulp of 5/3.
  EXPECT_NEAR(apply_scale(5.0, 3.0, ScaleUse::kMultiplyReciprocal, Arith::kFp64), 5.0 / 3.0, 1e-15);
  // bf16 ops round the fp32 result to bf16: 1/3 -> 0x3EAB = 0.333984375.
  EXPECT_EQ(div_in(Arith::kBf16, 1.0, 3.0), 0.333984375);
  EXPECT_EQ(in(Arith::kFp64, 0.1), 0.1);
  EXPECT_THAT(error_of([] { arith_of(DType::kI8, "model"); }), HasSubstr("I8"));
}

TEST(Numeric, RequireFiniteNamesTheFirstBadElement) {
  const std::vector<double> v = {1.0, 2.0, NAN, INFINITY};
  const auto msg = error_of([&] { require_finite(v, "layers.3.x"); });
  EXPECT_THAT(msg, HasSubstr("layers.3.x"));
  EXPECT_THAT(msg, HasSubstr("NaN at element 2"));
}

TEST(HostTensor, EncodeDecodeEveryDtypeExactly) {
  const std::vector<double> ints = {-128, -1, 0, 1, 127};
  for (DType d : {DType::kI8, DType::kI16, DType::kI32, DType::kI64}) {
    const auto t = encode(d, {5}, ints, Encoding::kExact, "t");
    EXPECT_EQ(decode(t.view(), "t"), ints) << dtype_name(d);
    EXPECT_EQ(decode_ints(t.view(), "t"), (std::vector<int64_t>{-128, -1, 0, 1, 127}));
  }
  const std::vector<double> fp8 = {-448, -0.001953125, 0, 1.125, 448};
  EXPECT_EQ(decode(encode(DType::kF8E4M3, {5}, fp8, Encoding::kExact, "s").view(), "s"), fp8);
  const std::vector<double> fp4 = {-6, -0.5, 0, 1.5, 3};
  const auto p = encode(DType::kF4, {5}, fp4, Encoding::kExact, "p");
  EXPECT_EQ(p.bytes.size(), 3u);
  EXPECT_EQ(p.bytes[0], 0x9F);  // element 0 (-6 = 0xF) low, element 1 (-0.5 = 0x9) high
  EXPECT_EQ(decode(p.view(), "p"), fp4);
  const std::vector<double> e8 = {0x1p-127, 0.25, 1, 0x1p127};
  EXPECT_EQ(decode(encode(DType::kF8E8M0, {4}, e8, Encoding::kExact, "e").view(), "e"), e8);
  // kNearest rounds once; kExact refuses.
  const std::vector<double> third = {1.0 / 3.0};
  EXPECT_EQ(decode(encode(DType::kBF16, {1}, third, Encoding::kNearest, "b").view(), "b")[0],
            0.333984375);
  EXPECT_THAT(error_of([&] { encode(DType::kBF16, {1}, third, Encoding::kExact, "w.scale"); }),
              HasSubstr("w.scale element 0"));
}

TEST(HostTensor, EncodeRejectsOutOfRangeAndNaN) {
  const std::vector<double> big = {128};
  EXPECT_THAT(error_of([&] { encode(DType::kI8, {1}, big, Encoding::kExact, "q"); }),
              HasSubstr("not an integer in [-128"));
  const std::vector<double> half = {0.5};
  EXPECT_THAT(error_of([&] { encode(DType::kI32, {1}, half, Encoding::kExact, "q"); }),
              HasSubstr("q element 0"));
  const std::vector<double> nan = {NAN};
  EXPECT_THAT(error_of([&] { encode(DType::kF32, {1}, nan, Encoding::kNearest, "s"); }),
              HasSubstr("NaN"));
  const std::vector<double> huge = {1e39};
  EXPECT_THAT(error_of([&] { encode(DType::kF32, {1}, huge, Encoding::kNearest, "s"); }),
              HasSubstr("overflows"));
  const std::vector<double> three = {3.0};
  EXPECT_THAT(error_of([&] { encode(DType::kF8E8M0, {1}, three, Encoding::kExact, "e"); }),
              HasSubstr("power of two"));
  const std::vector<double> two = {1, 2};
  EXPECT_THAT(error_of([&] { encode(DType::kF32, {3}, two, Encoding::kExact, "s"); }),
              HasSubstr("2 values for shape [3]"));
}

// Exact reference for one dot product of integer codes.
__extension__ typedef __int128 Int128;

TEST(ScaledGemm, IntegerAccumulationIsExactOnAllMaxInputs) {
  // Adversarial: every code at the int8 extreme, K = 65536, so every partial sum is a multiple
  // of 127*127 up to 2^30: an fp32 accumulator would lose the low bits long before the end.
  const int64_t k = 65536;
  QuantizedMatrix x{1, k, std::vector<int64_t>(k, -128), 1.0, 1, k, Matrix(1, 1, 1.0), {}, {}};
  QuantizedMatrix w{2, k, std::vector<int64_t>(2 * k, 127), 1.0, 1, k, Matrix(2, 1, 1.0), {}, {}};
  for (int64_t i = 0; i < k; i += 3)
    w.codes[static_cast<size_t>(k + i)] = -128;
  const Matrix y = scaled_gemm(x, w);
  for (int64_t n = 0; n < 2; ++n) {
    Int128 ref = 0;
    for (int64_t i = 0; i < k; ++i)
      ref += static_cast<Int128>(-128) * w.code(n, i);
    EXPECT_EQ(y(0, n), static_cast<double>(ref)) << n;
  }
  // The same sum does not fit an int32 accumulator: reported, not wrapped.
  x.codes.assign(static_cast<size_t>(k) * 4, -128);
  x.cols = w.cols = 4 * k;
  x.block_cols = 4 * k;
  w.codes.assign(static_cast<size_t>(8 * k), -128);
  w.block_cols = 4 * k;
  EXPECT_THAT(error_of([&] { scaled_gemm(x, w, true); }), HasSubstr("int32 accumulator overflow"));
}

TEST(ScaledGemm, SegmentsFollowBothScaleGrids) {
  // x scales per 2 columns, w scales per 3 columns, K = 6: segments [0,2) [2,3) [3,4) [4,6).
  // All codes 1, so y = sum over k of sx(k) * sw(k), worked by hand:
  //   sx = [1, 1, 10, 10, 100, 100], sw = [2, 2, 2, 3, 3, 3]
  //   y  = 2 + 2 + 20 + 30 + 300 + 300 = 654.
  QuantizedMatrix x{1, 6, std::vector<int64_t>(6, 1), 1.0, 1, 2, Matrix(1, 3), {}, {}};
  x.scales.data = {1, 10, 100};
  QuantizedMatrix w{1, 6, std::vector<int64_t>(6, 1), 1.0, 1, 3, Matrix(1, 2), {}, {}};
  w.scales.data = {2, 3};
  EXPECT_EQ(scaled_gemm(x, w)(0, 0), 654.0);
  // Lattice: e4m3 codes as multiples of 2^-9. 448 * 448 * 6 on lattice 2^-18 is exact.
  QuantizedMatrix a{
      1,  6, std::vector<int64_t>(6, lattice_code(448, 0x1p-9)), 0x1p-9, 1, 6, Matrix(1, 1, 1.0),
      {}, {}};
  QuantizedMatrix b{
      1,  6, std::vector<int64_t>(6, lattice_code(-448, 0x1p-9)), 0x1p-9, 1, 6, Matrix(1, 1, 0.5),
      {}, {}};
  EXPECT_EQ(scaled_gemm(a, b)(0, 0), -448.0 * 448.0 * 6 * 0.5);
  EXPECT_THAT(error_of([] { lattice_code(0.3, 0.5); }), HasSubstr("not on the lattice"));
}

// The bit-trick bf16 rounding is the codec's, bit for bit: on every bf16 value's float and the
// floats around each of its rounding boundaries (exact ties, one float ulp either side, the
// largest float below the next code), both signs, the infinities and NaN, plus 2^20 random floats.
TEST(Numeric, Bf16OfFloatIsTheCodecsRounding) {
  const auto same = [](float f) {
    const double want =
        codec::round_to(codec::kBF16, static_cast<double>(f), codec::Overflow::kNonSaturating);
    const double got = bf16_of_float(f);
    if (std::isnan(want)) return std::isnan(got) && std::signbit(got) == std::signbit(want);
    return std::memcmp(&want, &got, sizeof got) == 0;
  };
  const auto of_bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  int64_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (const uint32_t lo : {0x0u, 0x1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float f = of_bits((hi << 16) | lo);
      ASSERT_TRUE(same(f)) << std::hex << ((hi << 16) | lo);
      ++checked;
    }
  std::mt19937 rng(static_cast<uint32_t>(test::test_seed()));
  for (int i = 0; i < (1 << 20); ++i) {
    const uint32_t b = static_cast<uint32_t>(rng());
    ASSERT_TRUE(same(of_bits(b))) << std::hex << b;
  }
  EXPECT_EQ(checked, 6 * 65536);
  EXPECT_EQ(in(Arith::kBf16, 1.0 + 0x1p-8), 1.0);               // a tie goes to even
  EXPECT_EQ(in(Arith::kBf16, 1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);  // and up from odd
}

// Every kernel this CPU can run, the CPU's own choice last.
std::vector<DotKernel> runnable_kernels() {
  std::vector<DotKernel> kernels = {DotKernel::kPortable};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    kernels.push_back(DotKernel::kAvx2);
  if (__builtin_cpu_supports("avx512f")) kernels.push_back(DotKernel::kAvx512);
  kernels.push_back(DotKernel::kAuto);
  return kernels;
}

// The register-blocked product keeps each output the scalar loop's ascending-k chain of fused
// multiply-adds (the bits policy, matmul.h): bit for bit, for every kernel and tile shape (tokens
// 1..13 cover the 4-, 6- and 8-token tiles and every remainder; rows 1..49 the 4-, 8- and 24-row
// panels and partial ones; k across the 128- and 256-wide column blocks), on values spread over
// many exponents so that any reordering, or a product rounded before its addition, would show.
TEST(Matmul, RegisterBlockedSumsEqualTheFusedScalarLoopBitForBit) {
  std::mt19937_64 rng(test::test_seed());
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-30, 30);
  const auto value = [&] { return std::ldexp(mant(rng), expo(rng)); };
  int64_t unfused_differs = 0;
  for (const DotKernel kernel : runnable_kernels())
    for (const int64_t tokens : {1, 3, 4, 5, 6, 7, 8, 9, 13})
      for (const int64_t rows : {1, 4, 7, 8, 9, 17, 24, 25, 49})
        for (const int64_t k : {0, 1, 17, 128, 129, 256, 257, 600}) {
          set_dot_kernel(kernel);
          Matrix x(tokens, k), w(rows, k);
          for (double& v : x.data)
            v = value();
          for (double& v : w.data)
            v = value();
          const Matrix y = matmul_nt(x, w);
          for (int64_t t = 0; t < tokens; ++t)
            for (int64_t n = 0; n < rows; ++n) {
              volatile double acc = 0.0, unfused = 0.0;  // one rounding per step, in this order
              for (int64_t j = 0; j < k; ++j) {
                acc = std::fma(x(t, j), w(n, j), acc);
                volatile double p = x(t, j) * w(n, j);
                unfused = unfused + p;
              }
              ASSERT_EQ(y(t, n), acc) << tokens << "x" << rows << "x" << k << " at " << t << ","
                                      << n << ", kernel " << dot_kernel_name(dot_kernel());
              unfused_differs += unfused != acc;
            }
        }
  set_dot_kernel(DotKernel::kAuto);
  // The check can fail: on these values the unfused loop's bits differ from the fused ones.
  EXPECT_GT(unfused_differs, 1000);
  if (!__builtin_cpu_supports("avx512f"))
    std::cout << "note: this CPU has no AVX-512; its kernel was not checked\n";
}

TEST(Matmul, KernelNamesParseAndAnUnknownOneIsRefused) {
  for (const DotKernel k :
       {DotKernel::kAuto, DotKernel::kPortable, DotKernel::kAvx2, DotKernel::kAvx512})
    EXPECT_EQ(parse_dot_kernel(dot_kernel_name(k)), k);
  EXPECT_THAT(error_of([] { parse_dot_kernel("sse2"); }),
              HasSubstr("valid: auto, portable, avx2, avx512"));
}

// The quantized GEMMs run the fp64 panel kernel over codes as doubles (matmul_nt_rows_segmented):
// the outputs must be the documented loops' bits, written here one operation at a time: per
// segment the int128 code sum (scaled_gemm) or the ascending-k fp64 sum (weight_only_gemm), then
// acc + ((sum * lattice) * sx) * sw over segments in order. Shapes cover token tiles and panels
// with remainders, groups of 1, 32 and K, zero points, e4m3 lattice codes, 2-D weight blocks, and
// codes past the 2^53 bound (the int128 loop then runs itself).
TEST(ScaledGemm, PanelKernelGivesTheDocumentedLoopsBitForBit) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> sc(0.01, 2.0);
  struct Case {
    int64_t t, n, k, xg, wg, wrows;
    int64_t lo, hi;  // code range
    double lattice;
    bool zeros;
  };
  const Case cases[] = {{5, 7, 96, 32, 48, 4, -128, 127, 1.0, false},
                        {13, 17, 600, 600, 32, 1, -8, 7, 1.0, true},
                        {1, 9, 257, 1, 257, 1, -229376, 229376, 0x1p-9, false},
                        {7, 8, 384, 128, 128, 128, -229376, 229376, 0x1p-9, false},
                        {3, 5, 64, 64, 32, 1, -(int64_t{1} << 40), int64_t{1} << 40, 1.0, false}};
  for (const DotKernel kernel : runnable_kernels())
    for (const Case& c : cases) {
      set_dot_kernel(kernel);
      std::uniform_int_distribution<int64_t> code(c.lo, c.hi);
      const auto blocks = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
      QuantizedMatrix x{c.t, c.k, {}, c.lattice, 1, c.xg, Matrix(c.t, blocks(c.k, c.xg)), {}, {}};
      QuantizedMatrix w{
          c.n, c.k, {}, c.lattice, c.wrows, c.wg, Matrix(blocks(c.n, c.wrows), blocks(c.k, c.wg)),
          {},  {}};
      for (int64_t i = 0; i < c.t * c.k; ++i)
        x.codes.push_back(code(rng));
      for (int64_t i = 0; i < c.n * c.k; ++i)
        w.codes.push_back(code(rng));
      for (auto& v : x.scales.data)
        v = sc(rng);
      for (auto& v : w.scales.data)
        v = sc(rng);
      if (c.zeros)
        for (size_t i = 0; i < w.scales.data.size(); ++i)
          w.zero_points.push_back(code(rng) / 2);
      w.compact();
      const Matrix xd = dequantize(x);
      const Matrix y = scaled_gemm(x, w), yw = weight_only_gemm(xd, w);
      std::vector<int64_t> cuts;
      for (int64_t j = 0; j < c.k; ++j)
        if (j % c.xg == 0 || j % c.wg == 0) cuts.push_back(j);
      cuts.push_back(c.k);
      std::vector<int64_t> wcuts;
      for (int64_t j = 0; j < c.k; j += c.wg)
        wcuts.push_back(j);
      wcuts.push_back(c.k);
      for (int64_t t = 0; t < c.t; ++t)
        for (int64_t n = 0; n < c.n; ++n) {
          volatile double acc = 0.0;
          for (size_t s = 0; s + 1 < cuts.size(); ++s) {
            Int128 dot = 0;
            for (int64_t j = cuts[s]; j < cuts[s + 1]; ++j)
              dot += static_cast<Int128>(x.code(t, j)) * w.code(n, j);
            volatile double term = static_cast<double>(dot) * (c.lattice * c.lattice);
            term = term * x.scale(t, cuts[s]);
            term = term * w.scale(n, cuts[s]);
            acc = acc + term;
          }
          ASSERT_EQ(y(t, n), acc) << "scaled " << c.k << " at " << t << "," << n << " "
                                  << test::seed_note(seed);
          volatile double accw = 0.0;
          for (size_t s = 0; s + 1 < wcuts.size(); ++s) {
            volatile double dot = 0.0;
            for (int64_t j = wcuts[s]; j < wcuts[s + 1]; ++j)
              dot = std::fma(xd(t, j), static_cast<double>(w.code(n, j)), dot);
            volatile double term = dot * c.lattice;
            term = term * w.scale(n, wcuts[s]);
            accw = accw + term;
          }
          ASSERT_EQ(yw(t, n), accw)
              << "weight-only " << c.k << " at " << t << "," << n << " " << test::seed_note(seed);
        }
    }
  set_dot_kernel(DotKernel::kAuto);
}

TEST(ScaledGemm, AgreesWithDequantizedMatmul) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> code(-128, 127);
  std::uniform_real_distribution<double> sc(0.01, 2.0);
  QuantizedMatrix x{5, 96, {}, 1.0, 1, 32, Matrix(5, 3), {}, {}};
  QuantizedMatrix w{7, 96, {}, 1.0, 4, 48, Matrix(2, 2), {}, {}};
  for (int i = 0; i < 5 * 96; ++i)
    x.codes.push_back(code(rng));
  for (int i = 0; i < 7 * 96; ++i)
    w.codes.push_back(code(rng));
  for (auto& s : x.scales.data)
    s = sc(rng);
  for (auto& s : w.scales.data)
    s = sc(rng);
  const Matrix ref = matmul_nt(dequantize(x), dequantize(w));
  EXPECT_LT(test::relative_l2(scaled_gemm(x, w), ref), 1e-14) << test::seed_note(seed);
  EXPECT_LT(test::relative_l2(weight_only_gemm(dequantize(x), w), ref), 1e-14)
      << test::seed_note(seed);
  w.scales = Matrix(1, 1);
  EXPECT_THAT(error_of([&] { scaled_gemm(x, w); }), HasSubstr("does not cover"));
}

// Codes in, the same codes out, for every storage kind; the kind is the narrowest that fits.
TEST(CodeStore, EveryKindRoundTripsExactly) {
  struct Case {
    std::vector<int64_t> codes;
    CodeStore::Kind kind;
  };
  std::vector<Case> cases;
  std::vector<int64_t> int4, int8, fp8, e2m1, i16, i32, i64;
  for (int64_t v = -8; v < 8; ++v)
    int4.push_back(v);
  for (int64_t v = -128; v < 128; ++v)
    int8.push_back(v);
  for (int b = 0; b < 256; ++b)  // every finite e4m3fn value on the 2^-9 lattice
    if ((b & 0x7F) != 0x7F)
      fp8.push_back(lattice_code(codec::e4m3fn_to_double(uint8_t(b)), 0x1p-9));
  for (int b = 0; b < 16; ++b)
    e2m1.push_back(lattice_code(codec::e2m1_to_double(uint8_t(b)), 0.5));
  for (int64_t v = -32768; v < 32768; v += 7)
    i16.push_back(v);
  // Few distinct values take a table whatever their range; many need the full width.
  for (int64_t i = 0; i < 300; ++i) {
    i32.push_back(INT32_MIN + i * 14000000);
    i64.push_back(INT64_MIN + i * 30000000000000000LL);
  }
  i32.push_back(INT32_MAX);
  i64.push_back(INT64_MAX);
  cases = {{int4, CodeStore::Kind::kOffset4},
           {int8, CodeStore::Kind::kOffset8},
           {fp8, CodeStore::Kind::kTable8},
           {e2m1, CodeStore::Kind::kTable4},
           {i16, CodeStore::Kind::kInt16},
           {i32, CodeStore::Kind::kInt32},
           {i64, CodeStore::Kind::kInt64},
           {{5, 5, 5}, CodeStore::Kind::kOffset4},
           {{INT64_MIN, 0, INT64_MAX}, CodeStore::Kind::kTable4}};
  for (const auto& c : cases) {
    // Odd lengths and shuffled order exercise the nibble packing.
    std::vector<int64_t> v = c.codes;
    v.push_back(v.front());
    std::mt19937_64 rng(7);
    std::shuffle(v.begin(), v.end(), rng);
    const CodeStore s = CodeStore::pack(v);
    EXPECT_EQ(s.kind(), c.kind) << code_store_kind_name(s.kind());
    EXPECT_EQ(s.decode_all(), v) << code_store_kind_name(c.kind);
    for (size_t i = 0; i < v.size(); i += 5)
      EXPECT_EQ(s.at(static_cast<int64_t>(i)), v[i]);
    std::vector<int64_t> mid(v.size() > 3 ? v.size() - 3 : 0);
    s.decode(1, mid);
    EXPECT_TRUE(std::equal(mid.begin(), mid.end(), v.begin() + 1));
    // As doubles, from every start and length parity (odd and even nibble ends), where exact.
    const bool exact = std::all_of(v.begin(), v.end(), [](int64_t code) {
      return std::fabs(static_cast<double>(code)) < 0x1p53;
    });
    if (!exact) {
      std::vector<double> one(1);
      EXPECT_THAT(error_of([&] { s.decode_as_doubles(0, one); }), HasSubstr("no exact double"));
      continue;
    }
    for (const int64_t begin : {0, 1, 2, 3})
      for (const int64_t len : {0, 1, 2, 3, 6, 7}) {
        if (begin + len > static_cast<int64_t>(v.size())) continue;
        std::vector<double> d(static_cast<size_t>(len));
        s.decode_as_doubles(begin, d);
        for (int64_t i = 0; i < len; ++i)
          ASSERT_EQ(d[static_cast<size_t>(i)],
                    static_cast<double>(v[static_cast<size_t>(begin + i)]))
              << code_store_kind_name(c.kind) << " from " << begin << " length " << len;
      }
    std::vector<double> all(v.size());
    s.decode_as_doubles(0, all);
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(all[i], static_cast<double>(v[i])) << code_store_kind_name(c.kind);
  }
  const CodeStore s = CodeStore::pack(int8);
  EXPECT_EQ(s.bytes(), int8.size());  // one byte per int8 code
  EXPECT_THAT(error_of([&] { s.at(256); }), HasSubstr("outside [0, 256)"));
}

// pack() runs in parallel chunks (min / max, the distinct-code table, the payload): the same
// store whatever the thread count, on arrays long enough to be cut, including codes whose table
// only overflows once the chunks' sets are joined (each chunk's 200 codes fit, their union not).
TEST(CodeStore, PackIsTheSameWhateverTheThreadCount) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const int64_t n = (int64_t{1} << 20) + 3;  // odd: the last nibble pair is half
  std::vector<std::vector<int64_t>> inputs;
  const auto draw = [&](auto make) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = make(i);
    inputs.push_back(std::move(v));
  };
  std::uniform_int_distribution<int64_t> u16(-8, 7), u256(-128, 127), big(-40000, 40000);
  draw([&](int64_t) { return u16(rng); });                           // offset4
  draw([&](int64_t) { return u256(rng); });                          // offset8
  draw([&](int64_t) { return u256(rng) * 1000; });                   // table8
  draw([&](int64_t) { return (u16(rng) - 100) * 77; });              // table4
  draw([&](int64_t) { return big(rng); });                           // int16
  draw([&](int64_t i) { return (i * 4 / n) * 200 + i % 200 * 3; });  // 200 per quarter: 800 in all
  const int saved = reference_threads();
  for (size_t c = 0; c < inputs.size(); ++c) {
    SCOPED_TRACE("input " + std::to_string(c) + test::seed_note(seed));
    set_reference_threads(1);
    const CodeStore one = CodeStore::pack(inputs[c]);
    set_reference_threads(4);
    const CodeStore four = CodeStore::pack(inputs[c]);
    EXPECT_EQ(one.kind(), four.kind()) << code_store_kind_name(four.kind());
    EXPECT_EQ(one.bytes(), four.bytes());
    EXPECT_EQ(one.min_code(), four.min_code());
    EXPECT_EQ(one.max_code(), four.max_code());
    EXPECT_EQ(four.decode_all(), inputs[c]);
    EXPECT_EQ(one.decode_all(), inputs[c]);
  }
  set_reference_threads(4);
  EXPECT_EQ(CodeStore::pack(inputs[5]).kind(), CodeStore::Kind::kInt16);
  EXPECT_EQ(CodeStore::pack(inputs[2]).kind(), CodeStore::Kind::kTable8);
  set_reference_threads(saved);
}

// compact() changes where the codes live, never what the GEMMs compute; zero points subtract.
TEST(QuantizedMatrixCompact, GemmsAreBitIdenticalAndZeroPointsSubtract) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> q(0, 15), zp(0, 15), code(-128, 127);
  std::uniform_real_distribution<double> sc(0.01, 2.0);
  QuantizedMatrix w{9, 64, {}, 1.0, 1, 16, Matrix(9, 4), {}, {}};
  for (int i = 0; i < 9 * 64; ++i)
    w.codes.push_back(q(rng));
  for (auto& s : w.scales.data)
    s = sc(rng);
  for (int i = 0; i < 9 * 4; ++i)
    w.zero_points.push_back(zp(rng));
  QuantizedMatrix x{3, 64, {}, 1.0, 1, 64, Matrix(3, 1, 0.5), {}, {}};
  for (int i = 0; i < 3 * 64; ++i)
    x.codes.push_back(code(rng));
  const Matrix xd = dequantize(x);
  const Matrix a = scaled_gemm(x, w), b = weight_only_gemm(xd, w), d = dequantize(w);
  EXPECT_EQ(w.code(2, 17), w.codes[2 * 64 + 17] - w.zero_points[2 * 4 + 1]);
  QuantizedMatrix c = w;
  c.compact();
  EXPECT_TRUE(c.compacted());
  EXPECT_TRUE(c.codes.empty());
  EXPECT_EQ(c.packed.kind(), CodeStore::Kind::kOffset4);
  EXPECT_EQ(scaled_gemm(x, c).data, a.data) << test::seed_note(seed);
  EXPECT_EQ(weight_only_gemm(xd, c).data, b.data) << test::seed_note(seed);
  EXPECT_EQ(dequantize(c).data, d.data);
  EXPECT_EQ(c.code_vector(), w.code_vector());
  EXPECT_LT(c.bytes(), w.bytes() / 4);
  for (int64_t r = 0; r < 9; ++r)
    for (int64_t k = 0; k < 64; ++k)
      EXPECT_EQ(d(r, k), static_cast<double>(w.codes[static_cast<size_t>(r * 64 + k)] -
                                             w.zero_points[static_cast<size_t>(r * 4 + k / 16)]) *
                             w.scales(r, k / 16));
  c.zero_points.pop_back();
  EXPECT_THAT(error_of([&] { dequantize(c); }), HasSubstr("zero points for a scale grid"));
}

LinearShape qkv_shape() {
  LinearShape s;
  s.prefix = "model.layers.0.self_attn";
  s.partition_names = {"q_proj", "k_proj", "v_proj"};
  s.partitions = {4, 2, 2};
  s.in_features = 3;
  return s;
}

TEST(LinearMethod, FusedLoadAppliesInPartitionOrder) {
  UnquantizedLinearMethod m(qkv_shape(), {});
  // Partition p's weight is all (p + 1): the fused output rows follow q, k, v.
  for (int64_t p = 0; p < 3; ++p) {
    Matrix w(p == 0 ? 4 : 2, 3, static_cast<double>(p + 1));
    m.load_all(quantize_unquantized(w, DType::kBF16), p);
  }
  m.process_weights_after_loading();
  Matrix x(1, 3, 1.0);
  const Matrix y = m.apply(x);
  const std::vector<double> expect = {3, 3, 3, 3, 6, 6, 9, 9};
  EXPECT_EQ(y.data, expect);
}

TEST(LinearMethod, LoaderErrorsNameTheCheckpointTensor) {
  const auto make = [] {
    return std::make_unique<UnquantizedLinearMethod>(qkv_shape(), MethodConfig{});
  };
  const auto w43 = quantize_unquantized(Matrix(4, 3), DType::kBF16).at("weight");
  {
    auto m = make();
    EXPECT_THAT(error_of([&] { m->load("weight_scale", w43.view(), 0); }),
                HasSubstr("model.layers.0.self_attn.q_proj.weight_scale: unexpected tensor"));
    EXPECT_THAT(error_of([&] { m->load("weight", w43.view(), 1); }),
                HasSubstr("k_proj.weight: shape [4, 3] where the scheme expects [2, 3]"));
    auto i8 = w43;
    i8.dtype = DType::kI8;
    i8.bytes.resize(12);
    EXPECT_THAT(error_of([&] { m->load("weight", i8.view(), 0); }),
                HasSubstr("q_proj.weight: dtype I8"));
    m->load("weight", w43.view(), 0);
    EXPECT_THAT(error_of([&] { m->load("weight", w43.view(), 0); }), HasSubstr("loaded twice"));
    EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
                HasSubstr("model.layers.0.self_attn.k_proj.weight: missing"));
    EXPECT_THAT(error_of([&] { m->apply(Matrix(1, 3)); }), HasSubstr("apply before"));
  }
  {
    auto m = make();
    m->load("weight", w43.view(), 0);
    const auto w23 = quantize_unquantized(Matrix(2, 3), DType::kBF16).at("weight");
    m->load("weight", w23.view(), 1);
    m->load("weight", w23.view(), 2);
    m->process_weights_after_loading();
    EXPECT_THAT(error_of([&] { m->apply(Matrix(1, 4)); }), HasSubstr("input has 4 features"));
    Matrix bad(1, 3);
    bad(0, 1) = NAN;
    EXPECT_THAT(error_of([&] { m->apply(bad); }), HasSubstr("NaN at element 1"));
    EXPECT_THAT(error_of([&] { m->load("weight", w23.view(), 1); }), HasSubstr("loaded after"));
  }
}

TEST(LinearMethod, ExpertStacksNameTheExpertShard) {
  LinearShape s;
  s.prefix = "model.layers.1.mlp.experts";
  s.partition_names = {"gate_proj", "up_proj"};
  s.partitions = {2, 2};
  s.in_features = 4;
  s.num_experts = 3;
  UnquantizedLinearMethod m(s, {});
  const auto w = quantize_unquantized(Matrix(2, 4, 1.0), DType::kBF16);
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t p = 0; p < 2; ++p)
      if (!(e == 2 && p == 1)) m.load_all(w, p, e);
  EXPECT_THAT(error_of([&] { m.process_weights_after_loading(); }),
              HasSubstr("model.layers.1.mlp.experts.2.up_proj.weight: missing"));
  EXPECT_THAT(error_of([&] { m.load_all(w, 0, 3); }), HasSubstr("expert 3 of 3"));
}

TEST(KvCache, UnquantizedCacheRoundsToTheModelDtype) {
  UnquantizedKvCacheMethod kv({"model.layers.0.self_attn", 1, 2, DType::kBF16}, {});
  kv.process_weights_after_loading();
  Matrix x(1, 2);
  x.data = {1.0 / 3.0, 448.0};
  const Matrix r = kv.round_trip(KvWhich::kKey, x);
  EXPECT_EQ(r.data, (std::vector<double>{0.333984375, 448.0}));
  EXPECT_THAT(error_of([&] { kv.store(KvWhich::kValue, Matrix(1, 3)); }),
              HasSubstr("value rows have 3 channels"));
  const auto t = quantize_unquantized(Matrix(1, 1), DType::kBF16).at("weight");
  UnquantizedKvCacheMethod kv2({"model.layers.0.self_attn", 1, 2, DType::kBF16}, {});
  EXPECT_THAT(error_of([&] { kv2.load("k_scale", t.view()); }),
              HasSubstr("model.layers.0.self_attn.k_scale: unexpected tensor"));
}

}  // namespace
}  // namespace qparity::reference
