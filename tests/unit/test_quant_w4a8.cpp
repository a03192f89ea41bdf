// msModelSlim W4A8_DYNAMIC (`w4a8-dyn`, schemes/int/w4a8_dynamic.h): hand-worked weight
// codes and scales (round half even, the clamp at -8), the packed bytes, scale_bias [N, 1] and
// [N, 16], per-token int8 activation codes (the NPU's x * (127 / amax) and the ideal rule), the
// exact integer accumulation, the scale_bias load check, refusals, and an expert stack.
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schemes/int/w4a8_dynamic.h"
#include "schemes/method/method_factory.h"

#include "error_of.h"
#include "quant_test_util.h"
#include "test_seed.h"

namespace qparity::reference {
namespace {

using test::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

const SchemeId kW4A8{SchemeKind::kW4A8Dyn, 0};

Matrix rows_of(int64_t r, int64_t c, std::initializer_list<double> v) {
  Matrix m(r, c);
  m.data.assign(v.begin(), v.end());
  return m;
}

TensorMap quantize(const Matrix& w, const std::string& where, Dialect d) {
  QuantizeRequest r;
  r.weight = w;
  r.dialect = d;
  r.where = where;
  return quantize_linear(kW4A8, r);
}

std::unique_ptr<LinearMethod> dense(const std::string& prefix, int64_t n, int64_t k, Dialect d) {
  return make_linear_method(LinearShape::dense(prefix, n, k), method_config(kW4A8, d));
}

TEST(W4A8, WeightCodesRoundHalfEvenAndClampAtMinus8) {
  for (Dialect d : {Dialect::kIdeal, Dialect::kMsModelSlim}) {
    SCOPED_TRACE(std::string(to_string(d)));
    // scale 0.5: w / s = 2.5 -> 2, 3.5 -> 4, -0.5 -> 0, -2.5 -> -2, 7.6 -> 7 (clamp), -8.6 and
    // -8.5 -> -8 (clamp), -8 exactly is a code.
    EXPECT_EQ(w4a8_weight_code(1.25, 0.5, d), 2);
    EXPECT_EQ(w4a8_weight_code(1.75, 0.5, d), 4);
    EXPECT_EQ(w4a8_weight_code(-0.25, 0.5, d), 0);
    EXPECT_EQ(w4a8_weight_code(-1.25, 0.5, d), -2);
    EXPECT_EQ(w4a8_weight_code(3.8, 0.5, d), 7);
    EXPECT_EQ(w4a8_weight_code(-4.3, 0.5, d), -8);
    EXPECT_EQ(w4a8_weight_code(-4.25, 0.5, d), -8);
    EXPECT_EQ(w4a8_weight_code(-4.0, 0.5, d), -8);
    // s = amax / 7 stored as fp32; a zero row gets FLT_EPSILON.
    EXPECT_EQ(w4a8_weight_scale(3.5, d), 0.5);
    EXPECT_EQ(w4a8_weight_scale(1.0, d), static_cast<double>(1.0f / 7.0f));
    EXPECT_EQ(w4a8_weight_scale(0.0, d), std::ldexp(1.0, -23));
  }
}

TEST(W4A8, QuantizeWritesHandWorkedCodesBytesScalesAndScaleBias) {
  // Row 0: amax 7, s = 1; row 1: amax 3.5, s = 0.5 (both exact in fp32).
  const Matrix w = rows_of(2, 8,
                           {7, 2.5, -3.5, 0.5, -7, 1.49, 0, -0.5,  //
                            3.5, -1.25, 0.75, -0.25, 0.25, 1.75, -3.5, 0});
  // codes row 0: 7, 2, -4, 0, -7, 1, 0, 0 (2.5 -> 2, -3.5 -> -4, 0.5 -> 0, -0.5 -> 0)
  // codes row 1: 7, -2, 2, 0, 0, 4, -7, 0 (-2.5 -> -2, 1.5 -> 2, +-0.5 -> 0, 3.5 -> 4)
  // bytes (row 0 low nibble): 0x77, 0xE2, 0x2C, 0x00, 0x09, 0x41, 0x90, 0x00
  const std::vector<uint8_t> bytes = {0x77, 0xE2, 0x2C, 0x00, 0x09, 0x41, 0x90, 0x00};
  for (Dialect d : {Dialect::kIdeal, Dialect::kMsModelSlim}) {
    SCOPED_TRACE(std::string(to_string(d)));
    const TensorMap t = quantize(w, "model.layers.0.mlp.up_proj", d);
    const HostTensor& wt = t.at("weight");
    EXPECT_EQ(wt.dtype, DType::kI8);
    EXPECT_EQ(wt.shape, (std::vector<int64_t>{1, 8}));
    EXPECT_EQ(wt.bytes, bytes);
    EXPECT_EQ(t.at("weight_scale").shape, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(decode(t.at("weight_scale").view(), "s"), (std::vector<double>{1.0, 0.5}));
    EXPECT_EQ(decode(t.at("weight_offset").view(), "o"), (std::vector<double>{0.0, 0.0}));
    // scale_bias [2, 1]: 8 * (7 + 2 - 4 - 7 + 1) * 1 = -8; 8 * (7 - 2 + 2 + 4 - 7) * 0.5 = 16.
    EXPECT_EQ(t.at("scale_bias").dtype, DType::kF32);
    EXPECT_EQ(t.at("scale_bias").shape, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(decode(t.at("scale_bias").view(), "b"), (std::vector<double>{-8.0, 16.0}));
    EXPECT_EQ(t.count("bias"), 0u);
    // Round trip: the loaded layer's weight is exactly q * s.
    auto m = dense("model.layers.0.mlp.up_proj", 2, 8, d);
    m->load_all(t);
    m->process_weights_after_loading();
    EXPECT_EQ(m->dequantized_weight().data,
              (std::vector<double>{7, 2, -4, 0, -7, 1, 0, 0, 3.5, -1, 1, 0, 0, 2, -3.5, 0}));
  }
}

TEST(W4A8, DownProjScaleBiasHasSixteenChunksOfK) {
  // K = 32: chunk c covers columns 2c and 2c+1. Row 0: all 1.75 (amax 1.75, s = 0.25, codes 7):
  // each chunk 8 * 14 * 0.25 = 28. Row 1: column 2c holds q_c * 0.5 with q_c = c - 7 (c < 15),
  // q_15 = 7, column 2c+1 holds 0 (amax 3.5, s = 0.5): chunk c = 8 * q_c * 0.5 = 4 q_c.
  Matrix w(2, 32, 0.0);
  for (int64_t k = 0; k < 32; ++k)
    w(0, k) = 1.75;
  auto q_of = [](int64_t c) { return c < 15 ? c - 7 : int64_t{7}; };
  for (int64_t c = 0; c < 16; ++c)
    w(1, 2 * c) = static_cast<double>(q_of(c)) * 0.5;
  const TensorMap t = quantize(w, "model.layers.0.mlp.down_proj", Dialect::kMsModelSlim);
  ASSERT_EQ(t.at("scale_bias").shape, (std::vector<int64_t>{2, 16}));
  const std::vector<double> sb = decode(t.at("scale_bias").view(), "b");
  for (int64_t c = 0; c < 16; ++c) {
    EXPECT_EQ(sb[static_cast<size_t>(c)], 28.0) << c;
    EXPECT_EQ(sb[static_cast<size_t>(16 + c)], 4.0 * static_cast<double>(q_of(c))) << c;
  }
  // o_proj too; K not a multiple of 16 is refused for them, any other name has no rule.
  EXPECT_EQ(quantize(w, "model.layers.0.self_attn.o_proj", Dialect::kIdeal).at("scale_bias").shape,
            (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(w4a8_scale_bias_columns("q_proj"), 1);
  EXPECT_EQ(w4a8_scale_bias_columns("gate_proj"), 1);
  EXPECT_EQ(w4a8_scale_bias_columns("o_proj"), 16);
  const Matrix w24(2, 24, 1.0);
  EXPECT_THAT(error_of([&] { quantize(w24, "model.layers.0.mlp.down_proj", Dialect::kIdeal); }),
              AllOf(HasSubstr("model.layers.0.mlp.down_proj.scale_bias"),
                    HasSubstr("K = 24 is not a multiple of 16")));
  EXPECT_THAT(error_of([&] { quantize(w24, "model.layers.0.mlp.dense", Dialect::kIdeal); }),
              HasSubstr("'dense' would get the unsummed [N, K]"));
  // The loaded method accepts [N, 16] and checks it per chunk.
  auto m = dense("model.layers.0.mlp.down_proj", 2, 32, Dialect::kMsModelSlim);
  m->load_all(t);
  EXPECT_NO_THROW(m->process_weights_after_loading());
}

TEST(W4A8, ActivationCodesOfAHandWrittenRow) {
  // Row 0: amax 2 -> m = 127 / 2 = 63.5 (exact): 1 -> 63.5 -> 64 (tie to even), -0.5 -> -31.75
  // -> -32, 0.25 -> 15.875 -> 16, 2 -> 127, 0 -> 0, -1.984375 -> -126.015625 -> -126.
  // Row 1: amax 127, m = 1: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0, 127 -> 127 (ties to even).
  // Row 2: all zero -> codes 0, scale 0.
  const Matrix x = rows_of(3, 6,
                           {1.0, -0.5, 0.25, 2.0, 0.0, -1.984375,  //
                            127, 2.5, -3.5, 0.5, 0.0, -1.5,        //
                            0, 0, 0, 0, 0, 0});
  const std::vector<int64_t> codes = {64,  -32, 16, 127, 0, -126,  //
                                      127, 2,   -4, 0,   0, -2,    //
                                      0,   0,   0,  0,   0, 0};
  for (Dialect d : {Dialect::kIdeal, Dialect::kMsModelSlim, Dialect::kVllm}) {
    SCOPED_TRACE(std::string(to_string(d)));
    const QuantizedMatrix q = quantize_w4a8_input(x, d);
    EXPECT_EQ(q.codes, codes);
    EXPECT_EQ(q.scales(1, 0), 1.0);
    EXPECT_EQ(q.scales(2, 0), 0.0);
  }
  // The NPU stores 1 / (127 / amax) in fp32, the ideal rule amax / 127.
  EXPECT_EQ(quantize_w4a8_input(x, Dialect::kMsModelSlim).scales(0, 0),
            static_cast<double>(1.0f / 63.5f));
  EXPECT_EQ(quantize_w4a8_input(x, Dialect::kIdeal).scales(0, 0), 2.0 / 127.0);
  // An inexact multiplier: fp32(127 / 3) = 42.333336 (rounded up), so 3 -> 127.0000076 -> 127
  // and 1.5 -> 63.500004 -> 64; the stored scale is fp32(1 / 42.333336), not 3 / 127.
  const Matrix x3 = rows_of(1, 2, {3.0, 1.5});
  EXPECT_EQ(quantize_w4a8_input(x3, Dialect::kMsModelSlim).scales(0, 0),
            static_cast<double>(1.0f / (127.0f / 3.0f)));
  EXPECT_EQ(quantize_w4a8_input(x3, Dialect::kMsModelSlim).codes, (std::vector<int64_t>{127, 64}));
}

TEST(W4A8, OutputIsTheExactIntegerSumTimesBothScales) {
  // W row 0 = [7, -7, 3.5, 0] (s = 1, q = 7, -7, 4, 0); row 1 = [3.5, 0.5, -1.5, 0.25] (s = 0.5,
  // q = 7, 1, -3, 0). x = [2, -1, 0.5, 1]: NPU m = 63.5, codes 127, -64 (-63.5 -> even), 32
  // (31.75), 64 (63.5 -> even).
  // sum row 0 = 127*7 + 64*7 + 32*4 = 1465; row 1 = 127*7 - 64 - 96 = 729.
  const Matrix w = rows_of(2, 4, {7, -7, 3.5, 0, 3.5, 0.5, -1.5, 0.25});
  const Matrix x = rows_of(1, 4, {2, -1, 0.5, 1});
  auto m = dense("model.layers.0.self_attn.q_proj", 2, 4, Dialect::kMsModelSlim);
  m->load_all(quantize(w, "model.layers.0.self_attn.q_proj", Dialect::kMsModelSlim));
  m->process_weights_after_loading();
  const std::optional<QuantizedMatrix> xq = m->quantize_input(x);
  ASSERT_TRUE(xq);
  EXPECT_EQ(xq->codes, (std::vector<int64_t>{127, -64, 32, 64}));
  const double a_s = static_cast<double>(1.0f / 63.5f);
  const Matrix y = m->apply(x);
  EXPECT_DOUBLE_EQ(y(0, 0), a_s * 1.0 * 1465.0);
  EXPECT_DOUBLE_EQ(y(0, 1), a_s * 0.5 * 729.0);
  // The split the NPU kernel makes (x = 16 x_hi + x_lo + 8, x_hi = floor(x / 16), x_lo = (x & 15)
  // - 8) plus scale_bias = 8 * sum q * s gives the same number.
  const std::vector<int64_t> q0 = {7, -7, 4, 0};
  double split = 0.0;
  for (size_t k = 0; k < 4; ++k) {
    const int64_t c = xq->codes[k];
    const int64_t hi = c >= 0 ? c / 16 : -((-c + 15) / 16);
    const int64_t lo = (c & 15) - 8;
    ASSERT_EQ(16 * hi + lo + 8, c);
    split += static_cast<double>(16 * hi + lo) * static_cast<double>(q0[k]);
  }
  split += 8.0 * (7 - 7 + 4 + 0);  // scale_bias / s
  EXPECT_EQ(split, 1465.0);
}

TEST(W4A8, CorruptedScaleBiasIsRefusedNamingTheTensor) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 8, 64);
  const std::string p = "model.layers.3.mlp.gate_proj";
  const TensorMap good = quantize(w, p, Dialect::kMsModelSlim);
  auto load = [&](const TensorMap& t) {
    auto m = dense(p, 8, 64, Dialect::kMsModelSlim);
    m->load_all(t);
    m->process_weights_after_loading();
  };
  EXPECT_NO_THROW(load(good)) << test::seed_note(seed);
  auto with_bias = [&](size_t i, float v) {
    TensorMap t = good;
    std::memcpy(t.at("scale_bias").bytes.data() + 4 * i, &v, 4);
    return t;
  };
  const std::vector<double> sb = decode(good.at("scale_bias").view(), "b");
  const std::vector<double> sc = decode(good.at("weight_scale").view(), "s");
  // One fp32 ulp off (a producer's summation order) passes; the smallest real corruption, the
  // value of one code off by one (8 * s), fails either way.
  const auto f = static_cast<float>(sb[5]);
  EXPECT_NO_THROW(load(with_bias(5, std::nextafter(f, 1e30f)))) << test::seed_note(seed);
  EXPECT_NO_THROW(load(with_bias(5, std::nextafter(f, -1e30f)))) << test::seed_note(seed);
  EXPECT_THAT(
      error_of([&] { load(with_bias(5, static_cast<float>(sb[5] + 8 * sc[5]))); }),
      AllOf(HasSubstr(p + ".scale_bias"), HasSubstr("row 5 column 0"), HasSubstr("wrong output")));
  EXPECT_THAT(error_of([&] { load(with_bias(2, static_cast<float>(sb[2] - 8 * sc[2]))); }),
              HasSubstr(p + ".scale_bias: row 2"));
  // A nonzero weight_offset is refused too.
  TensorMap off = good;
  const float one = 1.0f;
  std::memcpy(off.at("weight_offset").bytes.data() + 4, &one, 4);
  EXPECT_THAT(error_of([&] { load(off); }),
              AllOf(HasSubstr(p + ".weight_offset"), HasSubstr("offsets must be 0")));
}

TEST(W4A8, RefusesOddNUnpackedLegacyWeightsAndOtherArgs) {
  EXPECT_THAT(error_of([&] { dense("model.layers.0.mlp.up_proj", 5, 16, Dialect::kIdeal); }),
              AllOf(HasSubstr("model.layers.0.mlp.up_proj.weight"),
                    HasSubstr("N = 5 output channels is odd")));
  EXPECT_THAT(error_of([&] { quantize(Matrix(3, 16, 1.0), "x.up_proj", Dialect::kIdeal); }),
              HasSubstr("x.up_proj.weight: N = 3 output channels is odd"));
  EXPECT_THAT(error_of([&] { dense("model.layers.0.mlp.down_proj", 4, 24, Dialect::kIdeal); }),
              HasSubstr("model.layers.0.mlp.down_proj.scale_bias: K = 24 is not a multiple of 16"));
  // Fused q/k/v with an odd partition names that partition's weight.
  LinearShape qkv;
  qkv.prefix = "model.layers.0.self_attn";
  qkv.partition_names = {"q_proj", "k_proj", "v_proj"};
  qkv.partitions = {8, 3, 3};
  qkv.in_features = 16;
  EXPECT_THAT(error_of([&] { make_linear_method(qkv, method_config(kW4A8, Dialect::kIdeal)); }),
              HasSubstr("model.layers.0.self_attn.k_proj.weight: N = 3"));
  // The pre-1.0.0 unpacked [N, K] weight (one int4 a byte).
  TensorMap t = quantize(Matrix(4, 16, 1.0), "model.layers.0.mlp.up_proj", Dialect::kIdeal);
  t["weight"] = encode_ints(DType::kI8, {4, 16}, std::vector<int64_t>(64, 7), "w");
  auto m = dense("model.layers.0.mlp.up_proj", 4, 16, Dialect::kIdeal);
  m->load_all(t);
  EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
              AllOf(HasSubstr("model.layers.0.mlp.up_proj.weight"),
                    HasSubstr("pre-1.0.0 unpacked W4A8 layout"), HasSubstr("not implemented")));
  // 8-bit weights are not this scheme.
  MethodConfig c = method_config(kW4A8, Dialect::kIdeal);
  c.weights->num_bits = 8;
  EXPECT_THAT(error_of([&] { make_linear_method(LinearShape::dense("l", 4, 16), c); }),
              HasSubstr("w4a8-dyn weights are static symmetric int 4-bit per channel"));
}

TEST(W4A8, ExpertStackMatchesItsExpertsOneByOne) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  LinearShape s;
  s.prefix = "model.layers.0.mlp.experts";
  s.partition_names = {"gate_proj", "up_proj"};
  s.partitions = {32, 32};
  s.in_features = 64;
  s.num_experts = 3;
  auto stack = make_linear_method(s, method_config(kW4A8, Dialect::kMsModelSlim));
  const Matrix x = test::gaussian_matrix(rng, 5, 64);
  std::vector<Matrix> want;
  for (int64_t e = 0; e < 3; ++e) {
    Matrix y(5, 64);
    for (int64_t p = 0; p < 2; ++p) {
      const std::string name = s.shard_prefix(e, p);
      const Matrix w = test::realistic_matrix(rng, 32, 64);
      const TensorMap t = quantize(w, name, Dialect::kMsModelSlim);
      stack->load_all(t, p, e);
      auto one = dense(name, 32, 64, Dialect::kMsModelSlim);
      one->load_all(t);
      one->process_weights_after_loading();
      const Matrix yp = one->apply(x);
      for (int64_t r = 0; r < 5; ++r)
        for (int64_t c = 0; c < 32; ++c)
          y(r, p * 32 + c) = yp(r, c);
    }
    want.push_back(y);
  }
  stack->process_weights_after_loading();
  for (int64_t e = 0; e < 3; ++e)
    EXPECT_EQ(stack->apply(x, e).data, want[static_cast<size_t>(e)].data)
        << "expert " << e << " " << test::seed_note(seed);
}

}  // namespace
}  // namespace qparity::reference
