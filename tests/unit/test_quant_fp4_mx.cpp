// NVFP4, MXFP4, MXFP8 and the E8M0 shared-exponent rules (schemes/fp4/nvfp4, math/mx_scale,
// fp4/mxfp4, fp8/mxfp8; spec/FORMATS.md §1.3, §1.4, §2.7, §2.8, §3.4, §3.5, §4.2, §5.9).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/codecs/float_format.h"
#include "core/codecs/int_packing.h"
#include "schemes/fp4/mxfp4.h"
#include "schemes/fp4/nvfp4.h"
#include "schemes/fp8/mxfp8.h"
#include "schemes/math/mx_scale.h"
#include "tests/unit/error_of.h"
#include "tests/unit/quant_test_util.h"
#include "tests/unit/test_seed.h"

namespace qparity::reference {
namespace {

using test::error_of;
using ::testing::HasSubstr;

QuantArgs fp_args(int bits, int64_t group, QuantStrategy st, DynamicMode dyn) {
  QuantArgs a;
  a.num_bits = bits;
  a.type = QuantType::kFloat;
  a.strategy = st;
  a.group_size = group;
  a.dynamic = dyn;
  return a;
}
QuantArgs nvfp4_w() {
  return fp_args(4, 16, QuantStrategy::kTensorGroup, DynamicMode::kStatic);
}
QuantArgs nvfp4_a() {
  return fp_args(4, 16, QuantStrategy::kTensorGroup, DynamicMode::kLocal);
}
QuantArgs mx_w(int bits) {
  return fp_args(bits, 32, QuantStrategy::kGroup, DynamicMode::kStatic);
}
QuantArgs mx_a(int bits) {
  return fp_args(bits, 32, QuantStrategy::kGroup, DynamicMode::kDynamic);
}

MethodConfig config(SchemeKind kind, Dialect d, std::optional<QuantArgs> w,
                    std::optional<QuantArgs> a) {
  MethodConfig c;
  c.scheme = SchemeId{kind, 0};
  c.dialect = d;
  c.weights = std::move(w);
  c.input_activations = std::move(a);
  return c;
}

QuantizeRequest request(const Matrix& w, Dialect d, bool activations, double act_amax = 1.0) {
  QuantizeRequest r;
  r.weight = w;
  r.dialect = d;
  r.model_dtype = DType::kF32;
  if (activations) {
    r.input_activations = nvfp4_a();
    r.activations = ActivationStats{-act_amax, act_amax * 0.5, {}};
  }
  return r;
}

Matrix rows_of(std::initializer_list<std::initializer_list<double>> rows) {
  Matrix m(static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.begin()->size()));
  int64_t r = 0;
  for (const auto& row : rows) {
    int64_t c = 0;
    for (double v : row)
      m(r, c++) = v;
    ++r;
  }
  return m;
}

// y = x_q @ w_q^T from the layer's own quantized operands, in plain fp64 (independent of
// scaled_gemm's segment bookkeeping).
Matrix reference_apply(const LinearMethod& m, const Matrix& x) {
  const auto xq = m.quantize_input(x);
  const Matrix xd = xq ? dequantize(*xq) : x;
  return matmul_nt(xd, m.dequantized_weight());
}

// ------------------------------------------------------------------------------------------
// e2m1 element rounding

TEST(Nvfp4Element, EveryE2m1CodeRoundTripsExactly) {
  for (uint8_t c = 0; c < 16; ++c) {
    const double v = codec::e2m1_to_double(c);
    const double q = e2m1_of_scaled_exact(v, 1.0, 1.0);
    EXPECT_EQ(q, v) << int(c);
    EXPECT_EQ(codec::double_to_e2m1(q), c) << int(c);  // 0x8 (-0) keeps its sign
    for (Dialect d : kAllDialects)
      EXPECT_EQ(nvfp4_quantize_element(v, 448.0, 448.0, nvfp4_rules(d)), v) << to_string(d);
  }
}

// The tie table of §1.3 through quantize_nvfp4: a 16-group with amax 6 and a tensor amax 6 give
// gs = 2688/6 = 448 and s = e4m3(448 * 6 / 6) = 448, so x / (s / gs) = x in every dialect.
TEST(Nvfp4Quantize, TieTableThroughQuantize) {
  const Matrix w = rows_of({{6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -5, 0.2500001, 5.0001,
                             -6, 0.7499999, 4.9999, 1.2500001}});
  const double expect[16] = {6, 0, 1, 1, 2, 2, 4, 4, -0.0, -4, 0.5, 6, -6, 0.5, 4, 1.5};
  for (Dialect d : kAllDialects) {
    const TensorMap t = quantize_nvfp4(request(w, d, false));
    EXPECT_EQ(decode(t.at("weight_global_scale").view(), "gs")[0], 448.0);
    EXPECT_EQ(decode(t.at("weight_scale").view(), "s")[0], 448.0);
    const Matrix dq = dequantize_nvfp4(t);
    for (int k = 0; k < 16; ++k)
      EXPECT_EQ(dq(0, k), expect[k]) << to_string(d) << " k=" << k;
  }
}

// Hand-worked: amax(W) = 6 * 2^-3 = 0.75 -> gs = 2688 / 0.75 = 3584. Row 0 (amax 0.75): s =
// e4m3(3584 * 0.75 / 6) = 448, element scale s/gs = 1/8: 0.75 -> 6 (code 7), -0.0625 -> -0.5
// (code 0x9), 0.1 -> 0.8 -> 1 (code 2), 0.3 -> 2.4 -> 2 (code 4). Row 1 (amax 0.375): s =
// e4m3(224) = 224, s/gs = 1/16: 0.375 -> 6, 0.1 -> 1.6 -> 1.5 (code 3).
TEST(Nvfp4Quantize, HandWorkedGroupWithAmaxSixTimesPowerOfTwo) {
  Matrix w(2, 16, 0.0);
  w(0, 0) = 0.75, w(0, 1) = -0.0625, w(0, 2) = 0.1, w(0, 3) = 0.3;
  w(1, 0) = 0.375, w(1, 1) = 0.1;
  const TensorMap t = quantize_nvfp4(request(w, Dialect::kIdeal, false));
  EXPECT_EQ(decode(t.at("weight_global_scale").view(), "gs")[0], 3584.0);
  const auto s = decode(t.at("weight_scale").view(), "s");
  EXPECT_EQ(s[0], 448.0);
  EXPECT_EQ(s[1], 224.0);
  const auto& p = t.at("weight_packed");
  ASSERT_EQ(p.shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(p.bytes[0], 0x97);  // low nibble element 0 (code 7), high element 1 (0x9)
  EXPECT_EQ(p.bytes[1], 0x42);
  EXPECT_EQ(p.bytes[8], 0x37);
  const Matrix dq = dequantize_nvfp4(t);
  EXPECT_EQ(dq(0, 2), 0.125);
  EXPECT_EQ(dq(1, 1), 0.09375);
}

// vLLM's test reference multiplies by fl32(1/fl32(s*fl32(1/gs))); compressed-tensors divides by
// fl32(s/gs). gs = fl32(1/7), s = 2, x = 17.5: exact x*gs/s = 1.2500000559 -> 1.5; CT t =
// 1.25000012 -> 1.5; vLLM t = 1.25 exactly -> tie -> 1.
TEST(Nvfp4Dialects, ReciprocalVersusDivisionChangesACode) {
  const double gs = in(Arith::kFp32, 1.0 / 7.0);
  EXPECT_EQ(nvfp4_quantize_element(17.5, 2.0, gs, nvfp4_rules(Dialect::kIdeal)), 1.5);
  EXPECT_EQ(nvfp4_quantize_element(17.5, 2.0, gs, nvfp4_rules(Dialect::kCompressedTensors)), 1.5);
  EXPECT_EQ(nvfp4_quantize_element(17.5, 2.0, gs, nvfp4_rules(Dialect::kVllm)), 1.0);
}

// Producers write `448.0 * 6.0 / amax` (a Python float over a tensor), which torch evaluates as
// amax.reciprocal() * 2688: two fp32 roundings. Scan bf16 amax values for one where that differs
// from the correctly rounded quotient (the device cross-check met such a weight: 847.4482421875
// from torch against 847.4483032226562 from a single division).
TEST(Nvfp4Dialects, GlobalScaleIsReciprocalTimesNumeratorAsTorchComputesIt) {
  int differing = 0;
  for (uint32_t code = 0x3C00; code < 0x4000; ++code) {  // bf16 amax in [2^-7, 2)
    const double amax = codec::bf16_to_double(static_cast<uint16_t>(code));
    const float recip = 1.0f / static_cast<float>(amax);
    const double torch_gs = static_cast<double>(recip * 2688.0f);
    const double div_gs = static_cast<double>(2688.0f / static_cast<float>(amax));
    EXPECT_EQ(nvfp4_global_scale(amax, nvfp4_rules(Dialect::kCompressedTensors)), torch_gs);
    EXPECT_EQ(nvfp4_global_scale(amax, nvfp4_rules(Dialect::kVllm)), torch_gs);
    EXPECT_EQ(nvfp4_global_scale(amax, nvfp4_rules(Dialect::kIdeal)), div_gs);
    differing += torch_gs != div_gs;
  }
  EXPECT_GT(differing, 0) << "the two roundings never differ: the test would not detect a mixup";
}

// compressed-tensors' observers keep a bf16 weight's min/max in bf16: the global scale is
// bf16(bf16(1/amax) * 2688) (torch's float / Tensor in bf16), then fp32, and each block scale
// e4m3(fl32(gs * bf16(amax16 / 6))) (calculate_qparams: a bf16 quotient times the fp32 global
// scale). The fp32 recipe main used for every model dtype differs on such weights.
TEST(Nvfp4Dialects, CompressedTensorsProducerComputesObserverStatisticsInTheModelDtype) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, 0.02);
  const auto bf16 = [](double v) {
    return codec::round_to(codec::kBF16, v, codec::Overflow::kNonSaturating);
  };
  const auto f32 = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  int gs_differs = 0, scale_differs = 0;
  for (int trial = 0; trial < 20; ++trial) {
    Matrix w(8, 64);
    for (double& v : w.data)
      v = bf16(d(rng));
    QuantizeRequest r = request(w, Dialect::kCompressedTensors, false);
    r.model_dtype = DType::kBF16;
    const TensorMap t = quantize_nvfp4(r);
    double amax = 0;
    for (double v : w.data)
      amax = std::max(amax, std::fabs(v));
    const double want_gs = f32(bf16(bf16(1.0 / amax) * 2688.0));
    const double gs = decode(t.at("weight_global_scale").view(), "gs")[0];
    ASSERT_EQ(gs, want_gs) << amax << " " << test::seed_note(seed);
    gs_differs += want_gs != f32(f32(1.0f / static_cast<float>(amax)) * 2688.0);
    const auto scales = decode(t.at("weight_scale").view(), "s");
    for (int64_t row = 0; row < 8; ++row)
      for (int64_t g = 0; g < 4; ++g) {
        double a = 0;
        for (int64_t k = 0; k < 16; ++k)
          a = std::max(a, std::fabs(w(row, g * 16 + k)));
        const double want = codec::round_to(
            codec::kE4M3FN, std::min(f32(gs * bf16(a / 6.0)), 448.0), codec::Overflow::kSaturate);
        ASSERT_EQ(scales[static_cast<size_t>(row * 4 + g)], want == 0 ? 0.125 : want);
        scale_differs +=
            want != codec::round_to(codec::kE4M3FN, std::min(f32(gs * f32(a / 6.0)), 448.0),
                                    codec::Overflow::kSaturate);
      }
  }
  // The model-dtype recipe is observable: some global or block scales differ from the fp32 one.
  EXPECT_GT(gs_differs + scale_differs, 0);
}

TEST(Nvfp4Dialects, ZeroGroupScaleIsEpsInCtAndZeroInVllmRef) {
  Matrix w(1, 32, 0.0);
  w(0, 0) = 1.0;  // group 1 is all zero
  const auto ct = quantize_nvfp4(request(w, Dialect::kCompressedTensors, false));
  const auto vl = quantize_nvfp4(request(w, Dialect::kVllm, false));
  EXPECT_EQ(ct.at("weight_scale").bytes[1], 0x20);  // 0.125 = 2^-3: exponent field 4
  EXPECT_EQ(vl.at("weight_scale").bytes[1], 0x00);
  for (const auto* t : {&ct, &vl}) {
    const Matrix dq = dequantize_nvfp4(*t);
    for (int k = 16; k < 32; ++k)
      EXPECT_EQ(dq(0, k), 0.0);
  }
}

TEST(Nvfp4Quantize, AllZeroTensorGivesUnitGlobalScaleAndZeroOutput) {
  const Matrix w(4, 32, 0.0);
  for (Dialect d : kAllDialects) {
    const auto t = quantize_nvfp4(request(w, d, true, 0.0));
    EXPECT_EQ(decode(t.at("weight_global_scale").view(), "gs")[0], 1.0);
    EXPECT_EQ(decode(t.at("input_global_scale").view(), "gs")[0], 1.0);
    for (double s : decode(t.at("weight_scale").view(), "s"))
      EXPECT_TRUE(std::isfinite(s));
    auto m = make_nvfp4_method(LinearShape::dense("l", 4, 32, DType::kF32),
                               config(SchemeKind::kNvfp4, d, nvfp4_w(), nvfp4_a()));
    m->load_all(t);
    m->process_weights_after_loading();
    std::mt19937_64 rng(1);
    const Matrix y = m->apply(test::gaussian_matrix(rng, 3, 32));
    for (double v : y.data)
      EXPECT_EQ(v, 0.0);
  }
}

// Property: |w - dq| <= (half the e2m1 step at t + clamp excess) * s/gs with t = |w|*gs/s.
TEST(Nvfp4Quantize, RoundTripWithinHalfAStep) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 24, 64);
  const auto t = quantize_nvfp4(request(w, Dialect::kIdeal, false));
  const Matrix dq = dequantize_nvfp4(t);
  const double gs = decode(t.at("weight_global_scale").view(), "gs")[0];
  const auto s = decode(t.at("weight_scale").view(), "s");
  for (int64_t n = 0; n < w.rows; ++n)
    for (int64_t k = 0; k < w.cols; ++k) {
      const double u = s[static_cast<size_t>(n * 4 + k / 16)] / gs;
      const double tt = std::fabs(w(n, k)) / u;
      const double half = tt < 2 ? 0.25 : (tt < 4 ? 0.5 : 1.0);
      EXPECT_LE(std::fabs(w(n, k) - dq(n, k)), (half + std::max(0.0, tt - 6)) * u * (1 + 1e-12))
          << test::seed_note(seed);
    }
}

// W4A4 apply == x_q @ w_q^T; W4A16 apply == x @ w_q^T.
TEST(Nvfp4Linear, ApplyMatchesDequantizedOperands) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 20, 64);
  const Matrix x = test::gaussian_matrix(rng, 5, 64, 0.7);
  for (Dialect d : kAllDialects)
    for (bool act : {true, false}) {
      const auto t = quantize_nvfp4(request(w, d, act, 2.5));
      auto m = make_nvfp4_method(
          LinearShape::dense("model.layers.0.mlp.down_proj", 20, 64, DType::kF32),
          config(SchemeKind::kNvfp4, d, nvfp4_w(), act ? std::optional(nvfp4_a()) : std::nullopt));
      m->load_all(t);
      m->process_weights_after_loading();
      EXPECT_EQ(m->quantize_input(x).has_value(), act);
      EXPECT_LT(test::relative_l2(m->apply(x), reference_apply(*m, x)), 1e-12)
          << to_string(d) << " " << test::seed_note(seed);
      EXPECT_LT(test::relative_l2(m->dequantized_weight(), w), 0.2) << test::seed_note(seed);
    }
}

// Static input gs from a calibration amax of 1; x with amax 10 saturates the e4m3 block scale at
// 448 and the elements at 6: dequantized x = 6 * 448 / 2688 = 1.
TEST(Nvfp4Linear, ActivationBeyondCalibrationSaturates) {
  Matrix x(1, 16, 0.0);
  x(0, 0) = 10.0, x(0, 1) = -7.0;
  const Nvfp4Rules r = nvfp4_rules(Dialect::kIdeal);
  const QuantizedMatrix q = nvfp4_quantize_activation(x, 2688.0, r);
  EXPECT_EQ(q.scales(0, 0), 448.0 / 2688.0);
  EXPECT_EQ(q.codes[0], 12);  // 6 on the lattice 0.5
  EXPECT_EQ(q.codes[1], -12);
}

// Adversarial exact accumulation: every weight and activation at the format max, K = 4096.
// Each 16-group contributes 16 * 36 * (448/2688)^2 exactly; a cancelling half sums to 0.
TEST(Nvfp4Linear, IntegerAccumulationIsExact) {
  const int64_t k = 4096;
  Matrix w(2, k, 1.0);
  for (int64_t c = k / 2; c < k; ++c)
    w(1, c) = -1.0;
  const auto t = quantize_nvfp4(request(w, Dialect::kIdeal, true, 1.0));
  auto m = make_nvfp4_method(LinearShape::dense("l", 2, k, DType::kF32),
                             config(SchemeKind::kNvfp4, Dialect::kIdeal, nvfp4_w(), nvfp4_a()));
  m->load_all(t);
  m->process_weights_after_loading();
  const Matrix y = m->apply(Matrix(1, k, 1.0));
  // gs = 2688, s = 448 on both sides: element scale 1/6, values 6 * 1/6 = 1 exactly.
  EXPECT_EQ(y(0, 0), static_cast<double>(k));
  EXPECT_EQ(y(0, 1), 0.0);
}

// q_proj / k_proj with different amax -> different global scales. ideal keeps each; vllm uses
// the max for both (the k_proj fp8 scales were made with its own gs: dequant is off by the
// ratio), which is further from the unquantized weight.
TEST(Nvfp4Fused, MaxGlobalScaleIsInexactAndPerPartitionIsCloser) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix wq = test::gaussian_matrix(rng, 8, 32, 1.0);
  const Matrix wk = test::gaussian_matrix(rng, 8, 32, 0.05);
  LinearShape s;
  s.prefix = "model.layers.0.self_attn";
  s.partition_names = {"q_proj", "k_proj"};
  s.partitions = {8, 8};
  s.in_features = 32;
  s.model_dtype = DType::kF32;
  Matrix full(16, 32);
  std::copy(wq.data.begin(), wq.data.end(), full.data.begin());
  std::copy(wk.data.begin(), wk.data.end(), full.data.begin() + 8 * 32);
  std::unique_ptr<LinearMethod> by[2];
  const Dialect ds[2] = {Dialect::kIdeal, Dialect::kVllm};
  for (int i = 0; i < 2; ++i) {
    by[i] = make_nvfp4_method(s, config(SchemeKind::kNvfp4, ds[i], nvfp4_w(), nvfp4_a()));
    by[i]->load_all(quantize_nvfp4(request(wq, Dialect::kIdeal, true, 1.0)), 0);
    by[i]->load_all(quantize_nvfp4(request(wk, Dialect::kIdeal, true, 4.0)), 1);
    by[i]->process_weights_after_loading();
  }
  const auto* vl = dynamic_cast<const Nvfp4LinearMethod*>(by[1].get());
  ASSERT_NE(vl, nullptr);
  EXPECT_EQ(vl->effective_weight_global_scale(0, 1), vl->effective_weight_global_scale(0, 0));
  EXPECT_EQ(vl->effective_input_global_scale(0, 0), 2688.0);  // max(2688/1, 2688/4)
  const double e_ideal = test::relative_l2(by[0]->dequantized_weight(), full);
  const double e_vllm = test::relative_l2(by[1]->dequantized_weight(), full);
  EXPECT_LT(e_ideal, 0.2) << test::seed_note(seed);
  EXPECT_GT(e_vllm, 2 * e_ideal) << test::seed_note(seed);
  const Matrix x = test::gaussian_matrix(rng, 3, 32);
  EXPECT_GT(test::max_abs_diff(by[0]->apply(x), by[1]->apply(x)), 0.0);
}

// 2-expert gate/up stack. sglang: weight gs of shard 0, input gs = min of the two shards.
TEST(Nvfp4Moe, ExpertStackRuntimeTensorsAndUnification) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  LinearShape s;
  s.prefix = "model.layers.0.mlp.experts";
  s.partition_names = {"gate_proj", "up_proj"};
  s.partitions = {8, 8};
  s.in_features = 32;
  s.num_experts = 2;
  s.model_dtype = DType::kF32;
  auto m = make_nvfp4_method(s, config(SchemeKind::kNvfp4, Dialect::kSglang, nvfp4_w(), nvfp4_a()));
  std::vector<std::vector<Matrix>> ws(2);
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t p = 0; p < 2; ++p) {
      ws[e].push_back(test::gaussian_matrix(rng, 8, 32, 0.5 + double(p) + double(e)));
      m->load_all(
          quantize_nvfp4(request(ws[e].back(), Dialect::kCompressedTensors, true, 1.0 + double(p))),
          p, e);
    }
  m->process_weights_after_loading();
  const TensorMap rt = m->runtime_tensors();
  EXPECT_EQ(rt.at("w13_weight_packed").shape, (std::vector<int64_t>{2, 16, 16}));
  EXPECT_EQ(rt.at("w13_weight_scale").shape, (std::vector<int64_t>{2, 16, 2}));
  EXPECT_EQ(rt.at("w13_weight_global_scale").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(rt.at("w13_input_global_scale").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(rt.at("w13_weight_scale_2").shape, (std::vector<int64_t>{2}));
  const auto gsw = decode(rt.at("w13_weight_global_scale").view(), "g");
  const auto* n = dynamic_cast<const Nvfp4LinearMethod*>(m.get());
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_EQ(n->effective_weight_global_scale(e, 1), gsw[static_cast<size_t>(2 * e)]);
    EXPECT_EQ(n->effective_input_global_scale(e, 0), 2688.0 / 2.0);  // min(2688/1, 2688/2)
    const Matrix x = test::gaussian_matrix(rng, 3, 32);
    EXPECT_LT(test::relative_l2(m->apply(x, e), matmul_nt(dequantize(*m->quantize_input(x, e)),
                                                          m->dequantized_weight(e))),
              1e-12);
  }
}

TEST(Nvfp4Constraints, ErrorsNameTheTensor) {
  const std::string pre = "model.layers.0.mlp.down_proj";
  EXPECT_THAT(error_of([&] {
                make_nvfp4_method(LinearShape::dense(pre, 4, 24),
                                  config(SchemeKind::kNvfp4, Dialect::kIdeal, nvfp4_w(), {}));
              }),
              HasSubstr(pre + ".weight_packed"));
  QuantArgs g32 = nvfp4_w();
  g32.group_size = 32;
  EXPECT_THAT(error_of([&] {
                make_nvfp4_method(LinearShape::dense(pre, 4, 32),
                                  config(SchemeKind::kNvfp4, Dialect::kIdeal, g32, {}));
              }),
              HasSubstr(pre + ".weight_scale"));
  std::mt19937_64 rng(3);
  const Matrix w = test::gaussian_matrix(rng, 4, 32);
  auto load_bad = [&](const std::string& name, auto mutate) {
    TensorMap t = quantize_nvfp4(request(w, Dialect::kIdeal, true));
    mutate(t.at(name));
    auto m = make_nvfp4_method(LinearShape::dense(pre, 4, 32),
                               config(SchemeKind::kNvfp4, Dialect::kIdeal, nvfp4_w(), nvfp4_a()));
    m->load_all(t);
    m->process_weights_after_loading();
  };
  EXPECT_THAT(error_of([&] { load_bad("weight_scale", [](HostTensor& h) { h.bytes[3] = 0x7F; }); }),
              HasSubstr(pre + ".weight_scale"));
  EXPECT_THAT(error_of([&] { load_bad("weight_scale", [](HostTensor& h) { h.bytes[0] = 0xFF; }); }),
              HasSubstr("NaN"));
  for (float bad : {0.0f, -1.0f, INFINITY, NAN}) {
    auto set = [bad](HostTensor& h) { std::memcpy(h.bytes.data(), &bad, 4); };
    EXPECT_THAT(error_of([&] { load_bad("weight_global_scale", set); }),
                HasSubstr(pre + ".weight_global_scale"));
    EXPECT_THAT(error_of([&] { load_bad("input_global_scale", set); }),
                HasSubstr(pre + ".input_global_scale"));
  }
  QuantizeRequest r = request(w, Dialect::kIdeal, true);
  r.activations.reset();
  r.where = pre;
  EXPECT_THAT(error_of([&] { quantize_nvfp4(r); }), HasSubstr(pre + ".input_global_scale"));
}

// ------------------------------------------------------------------------------------------
// E8M0 shared exponent

TEST(MxScale, ExponentIsExactAtPowersOfTwo) {
  const MxScaleRules ideal = mx_scale_rules(Dialect::kIdeal, MxElem::kE2M1, DType::kF32);
  for (int k = -100; k <= 100; ++k) {
    const double a = std::ldexp(1.0, k);
    EXPECT_EQ(mx_shared_exponent(a, ideal).exponent, k - 2) << k;
    EXPECT_EQ(mx_shared_exponent(std::nextafter(a, 0.0), ideal).exponent, k - 3) << k;
    EXPECT_EQ(mx_shared_exponent(std::nextafter(a, 1e300), ideal).exponent, k - 2) << k;
    EXPECT_EQ(floor_log2_exact(std::nextafter(a, 0.0)), k - 1);
  }
  EXPECT_EQ(floor_log2_exact(std::ldexp(1.0, -1074)), -1074);  // subnormal
}

// The >= 1.75 bump (CT / vLLM) against the OCP floor (ideal), at 1.75 * 2^k and one fp32 ulp
// below it (model dtype F32: the amax is held in fp32, as the producer holds it).
TEST(MxScale, BumpAtOnePointSevenFiveVersusOcpFloor) {
  for (MxElem el : {MxElem::kE2M1, MxElem::kE4M3}) {
    const int emax = mx_emax_elem(el);
    const auto ideal = mx_scale_rules(Dialect::kIdeal, el, DType::kF32);
    const auto ct = mx_scale_rules(Dialect::kCompressedTensors, el, DType::kF32);
    const auto vl = mx_scale_rules(Dialect::kVllm, el, DType::kF32);
    for (int k = -20; k <= 20; ++k) {
      const double at = std::ldexp(1.75, k);
      const double below = std::nextafter(static_cast<float>(at), 0.0f);
      EXPECT_EQ(mx_shared_exponent(at, ideal).exponent, k - emax);
      EXPECT_EQ(mx_shared_exponent(at, ct).exponent, k + 1 - emax);
      EXPECT_EQ(mx_shared_exponent(at, vl).exponent, k + 1 - emax);
      EXPECT_EQ(mx_shared_exponent(below, ct).exponent, k - emax);
      EXPECT_EQ(mx_shared_exponent(below, ideal).exponent, k - emax);
    }
  }
  // bf16 model: 1.7499 is 1.75 in bf16, so the bump already applies (the producer's bits).
  const auto ct_bf16 = mx_scale_rules(Dialect::kCompressedTensors, MxElem::kE2M1, DType::kBF16);
  EXPECT_EQ(mx_shared_exponent(1.7499, ct_bf16).exponent, -1);
  EXPECT_EQ(mx_shared_exponent(1.7, ct_bf16).exponent, -2);
  // msModelSlim MXFP4: floor(log2(amax * 8/7 + 9.6e-7)) - 2 bumps at 1.75 too.
  const auto ms = mx_scale_rules(Dialect::kMsModelSlim, MxElem::kE2M1, DType::kBF16);
  EXPECT_EQ(mx_shared_exponent(1.75, ms).exponent, -1);
  EXPECT_EQ(mx_shared_exponent(1.5, ms).exponent, -2);
  // msModelSlim MXFP8 uses the OCP floor rule.
  const auto ms8 = mx_scale_rules(Dialect::kMsModelSlim, MxElem::kE4M3, DType::kBF16);
  EXPECT_EQ(mx_shared_exponent(1.75, ms8).exponent, -8);
}

TEST(MxScale, ByteClampsAndZeroAmax) {
  const auto ideal = mx_scale_rules(Dialect::kIdeal, MxElem::kE2M1, DType::kF32);
  const auto ct = mx_scale_rules(Dialect::kCompressedTensors, MxElem::kE2M1, DType::kF32);
  const auto vl = mx_scale_rules(Dialect::kVllm, MxElem::kE2M1, DType::kF32);
  EXPECT_EQ(mx_shared_exponent(0.0, ideal).byte, 0);  // 2^-126 - 2 -> clamp -127
  EXPECT_EQ(mx_shared_exponent(0.0, ct).byte, 0);
  EXPECT_FALSE(mx_shared_exponent(0.0, ct).nan);
  // 1.75 * 2^127 bumps to 2^128 = inf in fp32: CT byte 255 (NaN), vLLM ref 254.
  const double big = std::ldexp(1.75, 127);
  EXPECT_EQ(mx_shared_exponent(big, ct).byte, 255);
  EXPECT_TRUE(mx_shared_exponent(big, ct).nan);
  EXPECT_EQ(mx_shared_exponent(big, vl).byte, 254);
  EXPECT_EQ(mx_shared_exponent(big, ideal).byte, 252);               // floor 127 - 2 + 127
  EXPECT_TRUE(mx_shared_exponent(std::ldexp(1.0, 130), ideal).nan);  // E = 128 > 127
  const auto ms = mx_scale_rules(Dialect::kMsModelSlim, MxElem::kE2M1, DType::kF32);
  // msModelSlim MXFP4: the + 9.6e-7 floors the exponent at floor(log2 9.6e-7) - 2 = -22, so a
  // zero (or tiny) block gets a finite scale and all-zero elements.
  EXPECT_EQ(mx_shared_exponent(0.0, ms).exponent, -22);
  EXPECT_EQ(mx_shared_exponent(std::ldexp(1.0, -140), ms).exponent, -22);
  EXPECT_FALSE(mx_shared_exponent(0.0, ms).zero_block);
}

// RNE vs half-away at exact ties (block amax 6 -> E = 0 in both rules).
TEST(MxScale, HalfEvenVersusHalfAwayAtTies) {
  const auto rne = mx_scale_rules(Dialect::kIdeal, MxElem::kE2M1, DType::kF32);
  const auto away = mx_scale_rules(Dialect::kMsModelSlim, MxElem::kE2M1, DType::kF32);
  const double ties[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -2.5};
  const double even[] = {0, 1, 1, 2, 2, 4, 4, -2};
  const double far[] = {0.5, 1, 1.5, 2, 3, 4, 6, -3};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(mx_quantize_element(ties[i], 0, rne), even[i]) << ties[i];
    EXPECT_EQ(mx_quantize_element(ties[i], 0, away), far[i]) << ties[i];
  }
  const auto rne8 = mx_scale_rules(Dialect::kIdeal, MxElem::kE4M3, DType::kF32);
  const auto away8 = mx_scale_rules(Dialect::kMsModelSlim, MxElem::kE4M3, DType::kF32);
  // 1 + 1/16 is the tie between 1 and 1.125 (step 1/8): even -> 1, away -> 1.125.
  EXPECT_EQ(mx_quantize_element(1.0625, 0, rne8), 1.0);
  EXPECT_EQ(mx_quantize_element(1.0625, 0, away8), 1.125);
  EXPECT_EQ(mx_quantize_element(500.0, 0, rne8), 448.0);  // saturates
  EXPECT_EQ(mx_quantize_element(-470.0, 0, away8), -448.0);
}

// ------------------------------------------------------------------------------------------
// MXFP4 / MXFP8

QuantizeRequest mx_request(const Matrix& w, Dialect d) {
  QuantizeRequest r;
  r.weight = w;
  r.dialect = d;
  r.model_dtype = DType::kF32;
  return r;
}

// Every E8M0 byte 0..254 round-trips: a block with amax 6 * 2^(b - 127) gets byte b (OCP:
// floor(log2(6 * 2^E)) - 2 = E) and dequantizes to 6 * 2^(b - 127) exactly.
TEST(Mxfp4, EveryE8m0ByteRoundTrips) {
  Matrix w(255, 32, 0.0);
  for (int b = 0; b < 255; ++b) {
    w(b, 0) = 6.0 * std::ldexp(1.0, b - 127);
    w(b, 1) = -0.5 * std::ldexp(1.0, b - 127);
  }
  const auto t = quantize_mxfp4(mx_request(w, Dialect::kIdeal));
  const Matrix dq = dequantize_mxfp4(t);
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(t.at("weight_scale").bytes[static_cast<size_t>(b)], b);
    EXPECT_EQ(dq(b, 0), w(b, 0));
    EXPECT_EQ(dq(b, 1), w(b, 1));
  }
}

TEST(Mxfp4, EveryE2m1CodeRoundTripsThroughQuantize) {
  Matrix w(1, 32, 0.0);
  for (int c = 0; c < 16; ++c)
    w(0, c) = codec::e2m1_to_double(static_cast<uint8_t>(c));
  for (Dialect d : kAllDialects) {
    const auto t = quantize_mxfp4(mx_request(w, d));
    const auto nib = codec::unpack_nibbles(t.at("weight_packed").bytes, 32);
    for (int c = 0; c < 16; ++c) {
      if (c == 8) continue;  // -0 may come back as 0x0 or 0x8: equal values
      EXPECT_EQ(nib[static_cast<size_t>(c)], c) << to_string(d);
    }
    EXPECT_EQ(dequantize_mxfp4(t)(0, 7), 6.0);
  }
}

// Block amax 1.75: ideal E = -2 (scale 1/4, 1.75 -> 7 -> 6 saturates: 1.5); CT E = -1 (scale
// 1/2, 1.75 -> 3.5 -> 4 -> 2).
TEST(Mxfp4, BumpChangesTheStoredByteAndTheValues) {
  Matrix w(1, 32, 0.0);
  w(0, 0) = 1.75;
  w(0, 1) = 0.3;
  const auto id = quantize_mxfp4(mx_request(w, Dialect::kIdeal));
  const auto ct = quantize_mxfp4(mx_request(w, Dialect::kCompressedTensors));
  EXPECT_EQ(id.at("weight_scale").bytes[0], 125);
  EXPECT_EQ(ct.at("weight_scale").bytes[0], 126);
  EXPECT_EQ(dequantize_mxfp4(id)(0, 0), 1.5);
  EXPECT_EQ(dequantize_mxfp4(ct)(0, 0), 2.0);
  EXPECT_EQ(dequantize_mxfp4(id)(0, 1), 0.25);  // 1.2 -> 1
  EXPECT_EQ(dequantize_mxfp4(ct)(0, 1), 0.25);  // 0.6 -> 0.5
}

TEST(Mxfp4, RoundTripWithinHalfAStepAndIdempotent) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 16, 128);
  const auto t = quantize_mxfp4(mx_request(w, Dialect::kIdeal));
  const Matrix dq = dequantize_mxfp4(t);
  for (int64_t n = 0; n < w.rows; ++n)
    for (int64_t k = 0; k < w.cols; ++k) {
      const double u =
          std::ldexp(1.0, t.at("weight_scale").bytes[static_cast<size_t>(n * 4 + k / 32)] - 127);
      const double tt = std::fabs(w(n, k)) / u;
      const double half = tt < 2 ? 0.25 : (tt < 4 ? 0.5 : 1.0);
      EXPECT_LE(std::fabs(w(n, k) - dq(n, k)), (half + std::max(0.0, tt - 6)) * u)
          << test::seed_note(seed);
    }
  // Idempotent on representable values (compared as values: -0 comes back as +0).
  const auto t2 = quantize_mxfp4(mx_request(dq, Dialect::kIdeal));
  EXPECT_EQ(t2.at("weight_scale").bytes, t.at("weight_scale").bytes) << test::seed_note(seed);
  EXPECT_EQ(dequantize_mxfp4(t2).data, dq.data) << test::seed_note(seed);
}

template <class Make, class Quant>
void check_mx_linear(SchemeKind kind, int bits, Make make, Quant quant) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 12, 96);
  const Matrix x = test::gaussian_matrix(rng, 4, 96);
  for (Dialect d : kAllDialects)
    for (bool act : {true, false}) {
      auto m = make(LinearShape::dense("model.layers.1.self_attn.o_proj", 12, 96, DType::kF32),
                    config(kind, d, mx_w(bits), act ? std::optional(mx_a(bits)) : std::nullopt));
      m->load_all(quant(mx_request(w, d)));
      m->process_weights_after_loading();
      EXPECT_EQ(m->quantize_input(x).has_value(), act);
      EXPECT_LT(test::relative_l2(m->apply(x), reference_apply(*m, x)), 1e-12)
          << to_string(d) << " " << test::seed_note(seed);
      // OCP floor rule (ideal, msmodelslim): amax / 2^E reaches 2x the element max, so block
      // maxima above it clamp (up to 1/4 off for e2m1 at 8 -> 6, 1/8 for e4m3 at 512 -> 448).
      // e4m3: every normal element is then within 1/8 of itself (clamp 1/8, rounding 1/16), so
      // rel_l2 < 1/8 (subnormals' absolute error, <= 2^-10 of 2^E, is negligible beside that);
      // a seed once measured 0.101 (a bound of 0.1 was a guess).
      EXPECT_LT(test::relative_l2(m->dequantized_weight(), w), bits == 4 ? 0.25 : 0.125)
          << to_string(d) << " " << test::relative_l2(m->dequantized_weight(), w) << " "
          << test::seed_note(seed);
    }
}

TEST(Mxfp4, ApplyMatchesDequantizedOperands) {
  check_mx_linear(SchemeKind::kMxfp4, 4, make_mxfp4_method, quantize_mxfp4);
}

TEST(Mxfp8, ApplyMatchesDequantizedOperands) {
  check_mx_linear(SchemeKind::kMxfp8, 8, make_mxfp8_method, quantize_mxfp8);
}

// All elements at the max (6 / 448) with K = 2048 and block exponents 0: exact sums.
TEST(MxLinear, IntegerAccumulationIsExact) {
  const int64_t k = 2048;
  for (int bits : {4, 8}) {
    const double mx = bits == 4 ? 6.0 : 448.0;
    // Block exponents 0: floor(log2 6) - 2 = 0, floor(log2 448) - 8 = 0.
    Matrix w(2, k, mx);
    for (int64_t c = 0; c < k; c += 2)
      w(1, c) = -mx;
    auto m = bits == 4
                 ? make_mxfp4_method(LinearShape::dense("l", 2, k, DType::kF32),
                                     config(SchemeKind::kMxfp4, Dialect::kIdeal, mx_w(4), mx_a(4)))
                 : make_mxfp8_method(LinearShape::dense("l", 2, k, DType::kF32),
                                     config(SchemeKind::kMxfp8, Dialect::kIdeal, mx_w(8), mx_a(8)));
    m->load_all(bits == 4 ? quantize_mxfp4(mx_request(w, Dialect::kIdeal))
                          : quantize_mxfp8(mx_request(w, Dialect::kIdeal)));
    m->process_weights_after_loading();
    const Matrix y = m->apply(Matrix(1, k, mx));
    EXPECT_EQ(y(0, 0), static_cast<double>(k) * mx * mx) << bits;
    EXPECT_EQ(y(0, 1), 0.0) << bits;
  }
}

TEST(MxLinear, AllZeroBlocksGiveFiniteScalesAndZeroOutput) {
  const Matrix w(3, 64, 0.0);
  for (Dialect d : kAllDialects) {
    for (int bits : {4, 8}) {
      const auto t =
          bits == 4 ? quantize_mxfp4(mx_request(w, d)) : quantize_mxfp8(mx_request(w, d));
      for (uint8_t b : t.at("weight_scale").bytes)
        EXPECT_NE(b, 255);
      auto m = bits == 4 ? make_mxfp4_method(LinearShape::dense("l", 3, 64, DType::kF32),
                                             config(SchemeKind::kMxfp4, d, mx_w(4), mx_a(4)))
                         : make_mxfp8_method(LinearShape::dense("l", 3, 64, DType::kF32),
                                             config(SchemeKind::kMxfp8, d, mx_w(8), mx_a(8)));
      m->load_all(t);
      m->process_weights_after_loading();
      std::mt19937_64 rng(5);
      for (double v : m->apply(test::gaussian_matrix(rng, 2, 64)).data)
        EXPECT_EQ(v, 0.0);
      for (double v : m->apply(Matrix(2, 64, 0.0)).data)
        EXPECT_EQ(v, 0.0);
    }
  }
}

TEST(MxLinear, ExpertStackRuntimeTensors) {
  LinearShape s;
  s.prefix = "model.layers.0.mlp.experts";
  s.partition_names = {"gate_proj", "up_proj"};
  s.partitions = {8, 8};
  s.in_features = 64;
  s.num_experts = 2;
  s.model_dtype = DType::kF32;
  std::mt19937_64 rng(test::test_seed());
  for (int bits : {4, 8}) {
    auto m = bits == 4
                 ? make_mxfp4_method(s, config(SchemeKind::kMxfp4, Dialect::kVllm, mx_w(4), {}))
                 : make_mxfp8_method(s, config(SchemeKind::kMxfp8, Dialect::kVllm, mx_w(8), {}));
    for (int64_t e = 0; e < 2; ++e)
      for (int64_t p = 0; p < 2; ++p) {
        const Matrix w = test::gaussian_matrix(rng, 8, 64);
        m->load_all(bits == 4 ? quantize_mxfp4(mx_request(w, Dialect::kVllm))
                              : quantize_mxfp8(mx_request(w, Dialect::kVllm)),
                    p, e);
      }
    m->process_weights_after_loading();
    const auto rt = m->runtime_tensors();
    if (bits == 4)
      EXPECT_EQ(rt.at("w13_weight_packed").shape, (std::vector<int64_t>{2, 16, 32}));
    else
      EXPECT_EQ(rt.at("w13_weight").shape, (std::vector<int64_t>{2, 16, 64}));
    EXPECT_EQ(rt.at("w13_weight_scale").shape, (std::vector<int64_t>{2, 16, 2}));
    const Matrix x = test::gaussian_matrix(rng, 2, 64);
    for (int64_t e = 0; e < 2; ++e)
      EXPECT_LT(test::relative_l2(m->apply(x, e), matmul_nt(x, m->dequantized_weight(e))), 1e-12);
  }
}

TEST(MxConstraints, ErrorsNameTheTensor) {
  const std::string pre = "model.layers.2.mlp.up_proj";
  EXPECT_THAT(error_of([&] {
                make_mxfp4_method(LinearShape::dense(pre, 4, 48),
                                  config(SchemeKind::kMxfp4, Dialect::kIdeal, mx_w(4), {}));
              }),
              HasSubstr(pre + ".weight_packed"));
  EXPECT_THAT(error_of([&] {
                make_mxfp8_method(LinearShape::dense(pre, 4, 48),
                                  config(SchemeKind::kMxfp8, Dialect::kIdeal, mx_w(8), {}));
              }),
              HasSubstr(pre + ".weight"));
  QuantArgs g16 = mx_w(4);
  g16.group_size = 16;
  EXPECT_THAT(error_of([&] {
                make_mxfp4_method(LinearShape::dense(pre, 4, 64),
                                  config(SchemeKind::kMxfp4, Dialect::kIdeal, g16, {}));
              }),
              HasSubstr(pre + ".weight_scale"));
  std::mt19937_64 rng(7);
  const Matrix w = test::gaussian_matrix(rng, 4, 64);
  for (int bits : {4, 8}) {
    TensorMap t = bits == 4 ? quantize_mxfp4(mx_request(w, Dialect::kIdeal))
                            : quantize_mxfp8(mx_request(w, Dialect::kIdeal));
    t.at("weight_scale").bytes[5] = 255;
    auto m = bits == 4
                 ? make_mxfp4_method(LinearShape::dense(pre, 4, 64),
                                     config(SchemeKind::kMxfp4, Dialect::kIdeal, mx_w(4), {}))
                 : make_mxfp8_method(LinearShape::dense(pre, 4, 64),
                                     config(SchemeKind::kMxfp8, Dialect::kIdeal, mx_w(8), {}));
    m->load_all(t);
    EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
                HasSubstr(pre + ".weight_scale: element 5 is 255"));
  }
  TensorMap t8 = quantize_mxfp8(mx_request(w, Dialect::kIdeal));
  t8.at("weight").bytes[2] = 0xFF;
  auto m8 = make_mxfp8_method(LinearShape::dense(pre, 4, 64),
                              config(SchemeKind::kMxfp8, Dialect::kIdeal, mx_w(8), {}));
  m8->load_all(t8);
  EXPECT_THAT(error_of([&] { m8->process_weights_after_loading(); }), HasSubstr(pre + ".weight"));
  // A block exponent above 127 is NaN in E8M0: quantize refuses to write it.
  Matrix huge(1, 32, 0.0);
  huge(0, 0) = 1e300;
  QuantizeRequest r = mx_request(huge, Dialect::kIdeal);
  r.where = pre;
  EXPECT_THAT(error_of([&] { quantize_mxfp4(r); }), HasSubstr(pre + ".weight_scale"));
}

}  // namespace
}  // namespace qparity::reference
