// FP8 E4M3 schemes: fp8-tensor, fp8-channel, fp8-block, kv-fp8 (schemes/fp8/fp8_*.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/codecs/float_format.h"
#include "schemes/description/quant_args.h"
#include "schemes/fp8/fp8_block.h"
#include "schemes/fp8/fp8_channel.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/fp8/fp8_tensor.h"
#include "schemes/kv/kv_fp8.h"
#include "schemes/method/method_factory.h"
#include "tests/unit/error_of.h"
#include "tests/unit/quant_test_util.h"
#include "tests/unit/test_seed.h"

namespace qparity::reference {
namespace {

using test::error_of;
using ::testing::HasSubstr;

QuantArgs qargs(const char* json) {
  return parse_quant_args(Json::parse(json), "test");
}

MethodConfig config(SchemeKind k, Dialect d, std::optional<QuantArgs> in, std::string format = "") {
  MethodConfig c;
  c.scheme = SchemeId{k, 0};
  c.dialect = d;
  c.input_activations = std::move(in);
  c.format = std::move(format);
  return c;
}

const char* kStatic = R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true})";
const char* kToken =
    R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})";
const char* kGroup =
    R"({"num_bits":8,"type":"float","strategy":"group","group_size":128,"symmetric":true,"dynamic":true})";

QuantizeRequest request(Matrix w, Dialect d, DType model = DType::kBF16) {
  QuantizeRequest r;
  r.weight = std::move(w);
  r.model_dtype = model;
  r.dialect = d;
  return r;
}

// Distance between neighbouring e4m3fn values at magnitude m.
double fp8_step(double m) {
  if (m < 0x1p-6) return 0x1p-9;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(m))) - 3);
}

std::vector<uint8_t> bytes_of(const HostTensor& t) {
  return t.bytes;
}

// ---------- hand-worked ----------

TEST(Fp8Tensor, HandWorkedCompressedTensorsBf16) {
  // amax = 3.5, s = 3.5/448 = 2^-7 (exact in bf16). x/s: 1 -> 128 (0x70), -2 -> -256 (0xF8),
  // 0.5 -> 64 (0x68), 3.5 -> 448 (0x7E).
  Matrix w(2, 2);
  w.data = {1.0, -2.0, 0.5, 3.5};
  const TensorMap t = quantize_fp8_tensor(request(w, Dialect::kCompressedTensors));
  EXPECT_EQ(t.at("weight").dtype, DType::kF8E4M3);
  EXPECT_EQ(bytes_of(t.at("weight")), (std::vector<uint8_t>{0x70, 0xF8, 0x68, 0x7E}));
  EXPECT_EQ(t.at("weight_scale").dtype, DType::kBF16);
  EXPECT_EQ(decode(t.at("weight_scale").view(), "s")[0], 0x1p-7);
  EXPECT_EQ(dequantize_fp8_tensor(t).data, w.data);
}

TEST(Fp8Tensor, FormatFp8WritesF32Scales) {
  Matrix w(1, 2);
  w.data = {3.0, -1.0};
  Fp8QuantizeOptions o;
  o.file = Fp8File::kFp8Config;
  const TensorMap t = quantize_fp8_tensor(request(w, Dialect::kIdeal), o);
  EXPECT_EQ(t.at("weight_scale").dtype, DType::kF32);
  // ideal: s = fp32(3/448); 3/s rounds to 448.
  const double s = static_cast<float>(3.0 / 448.0);
  EXPECT_EQ(decode(t.at("weight_scale").view(), "s")[0], s);
  EXPECT_EQ(decode(t.at("weight").view(), "w")[0], fp8_saturate(3.0 / s));
}

// A weight-only point writes no input scale even when the request carries calibration statistics
// (the fp8-tensor writer takes statistics for static inputs otherwise); the point with inputs
// writes one.
TEST(Fp8Tensor, WeightOnlyPointsWriteNoInputScale) {
  Matrix w(2, 32);
  for (size_t i = 0; i < w.data.size(); ++i)
    w.data[i] = 0.01 * static_cast<double>(i % 7) - 0.02;
  for (const std::string id :
       {"fp8-tensor-a16", "fp8-channel-a16", "fp8-block-a16", "fp8-tensor"}) {
    QuantizeRequest r = request(w, Dialect::kIdeal);
    r.activations = ActivationStats{-3.0, 2.0, {}};
    const TensorMap t = quantize_linear(parse_scheme_id(id), r);
    EXPECT_EQ(t.count("input_scale"), id == "fp8-tensor" ? 1u : 0u) << id;
  }
}

TEST(Fp8Common, SaturatesNeverNaN) {
  for (double t :
       {448.0, 449.0, 464.0, 464.0001, 470.0, 480.0, 1e30, static_cast<double>(INFINITY)}) {
    EXPECT_EQ(fp8_saturate(t), 448.0) << t;
    EXPECT_EQ(fp8_saturate(-t), -448.0) << t;
  }
  EXPECT_EQ(codec::double_to_e4m3fn(fp8_saturate(1e9), codec::Overflow::kSaturate), 0x7E);
  // A static input scale s: values far beyond 448*s saturate to 448 (0x7E) in every dialect.
  for (Dialect d : kAllDialects) {
    const Fp8ScaleRule r = fp8_rules(d).activation_rule(Fp8Act::kStatic, DType::kBF16);
    EXPECT_EQ(fp8_value(1000.0, 0.5, r), 448.0) << to_string(d);
    EXPECT_EQ(fp8_value(-1e6, 0.5, r), -448.0) << to_string(d);
  }
}

TEST(Fp8Common, ZeroTensorPerDialect) {
  Matrix w(3, 4, 0.0);
  // compressed-tensors: zero scale -> bf16 eps 2^-7, codes 0.
  auto ct = quantize_fp8_tensor(request(w, Dialect::kCompressedTensors));
  EXPECT_EQ(decode(ct.at("weight_scale").view(), "s")[0], 0x1p-7);
  for (uint8_t b : ct.at("weight").bytes)
    EXPECT_EQ(b & 0x7F, 0);
  // vllm (ops.scaled_fp8_quant dynamic per tensor): s = 0, x*(1/0) = NaN -> clamp -> 448.
  auto vl = quantize_fp8_tensor(request(w, Dialect::kVllm));
  EXPECT_EQ(decode(vl.at("weight_scale").view(), "s")[0], 0.0);
  for (uint8_t b : vl.at("weight").bytes)
    EXPECT_EQ(b, 0x7E);
  EXPECT_EQ(dequantize_fp8_tensor(vl).data, w.data);  // 448 * 0 = 0
  // Channel/block zero rows: finite scales, zero codes, in every dialect.
  for (Dialect d : kAllDialects) {
    auto c = quantize_fp8_channel(request(w, d));
    for (double s : decode(c.at("weight_scale").view(), "s"))
      EXPECT_GT(s, 0) << to_string(d);
    EXPECT_EQ(dequantize_fp8_channel(c).data, w.data);
    if (d == Dialect::kMsModelSlim) continue;
    auto b = quantize_fp8_block(request(w, d));
    for (double s : decode(b.at("weight_scale").view(), "s"))
      EXPECT_GT(s, 0) << to_string(d);
    EXPECT_EQ(dequantize_fp8_block(b).data, w.data);
  }
}

// ---------- dialect differences ----------

TEST(Fp8Dialect, DivideVersusReciprocalMultiply) {
  // Find an fp32 scale s and x with fp32(x/s) = 1.0625 exactly (an e4m3 tie between 1 and
  // 1.125 -> RNE gives 1.0) while fp32(x * fp32(1/s)) lands above it (-> 1.125).
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.001, 1.0);
  bool found = false;
  for (int i = 0; i < 200000 && !found; ++i) {
    const double s = static_cast<float>(u(rng));
    const double x = static_cast<float>(1.0625 * s);
    const double div = in(Arith::kFp32, x / s);
    const double mul = apply_scale(x, s, ScaleUse::kMultiplyReciprocal, Arith::kFp32);
    if (div != 1.0625 || !(mul > 1.0625)) continue;
    found = true;
    // vllm static input: x*(1/s) in fp32; compressed-tensors (F32 model): x/s in fp32.
    const auto vllm = fp8_rules(Dialect::kVllm).activation_rule(Fp8Act::kStatic, DType::kF32);
    const auto ct =
        fp8_rules(Dialect::kCompressedTensors).activation_rule(Fp8Act::kStatic, DType::kF32);
    EXPECT_EQ(fp8_value(x, s, vllm), 1.125) << "s=" << s << " x=" << x;
    EXPECT_EQ(fp8_value(x, s, ct), 1.0) << "s=" << s << " x=" << x;
    // SGLang per-token multiplies by 1/s too; vLLM per-token divides.
    EXPECT_EQ(fp8_rules(Dialect::kSglang).token_use, ScaleUse::kMultiplyReciprocal);
    EXPECT_EQ(fp8_rules(Dialect::kVllm).token_use, ScaleUse::kDivide);
  }
  EXPECT_TRUE(found);
}

TEST(Fp8Dialect, PerTokenFloorOnZeroAndTinyRows) {
  Matrix x(2, 4, 0.0);
  for (int64_t c = 0; c < 4; ++c)
    x(1, c) = 1e-9 * static_cast<double>(c + 1);
  const auto vq = quantize_activation_fp8(
      x, Fp8Act::kDynamicToken,
      fp8_rules(Dialect::kVllm).activation_rule(Fp8Act::kDynamicToken, DType::kBF16));
  const double floor32 = static_cast<float>(kVllmTokenMinScale);
  EXPECT_EQ(vq.scales(0, 0), floor32);  // all-zero row: the floor, codes 0
  EXPECT_EQ(vq.scales(1, 0), floor32);  // tiny row: 4e-9/448 < floor
  for (int64_t c : vq.codes)
    EXPECT_EQ(c, 0);  // 4e-9 / 4.4e-6 < 2^-10: rounds to 0
  const auto sq = quantize_activation_fp8(
      x, Fp8Act::kDynamicToken,
      fp8_rules(Dialect::kSglang).activation_rule(Fp8Act::kDynamicToken, DType::kBF16));
  EXPECT_EQ(sq.scales(0, 0), 0.0);  // no floor: scale 0, codes 0 (warp kernel)
  for (int64_t c = 0; c < 4; ++c)
    EXPECT_EQ(sq.code(0, c), 0);
  EXPECT_EQ(static_cast<double>(sq.code(1, 3)) * kFp8Lattice, 448.0);  // the row max maps to 448
  EXPECT_EQ(sq.scales(1, 0), static_cast<double>(static_cast<float>(4e-9) / 448.0f));
}

TEST(Fp8Dialect, Ue8m0GroupScales) {
  Fp8Rules r = fp8_rules(Dialect::kVllm);
  r.group_ue8m0 = true;
  Matrix x(1, 130);
  for (int64_t c = 0; c < 130; ++c)
    x(0, c) = 0.01 * static_cast<double>(c % 7 + 1);
  const auto q = quantize_activation_fp8(x, Fp8Act::kDynamicGroup,
                                         r.activation_rule(Fp8Act::kDynamicGroup, DType::kBF16));
  ASSERT_EQ(q.scales.cols, 2);          // ragged: 128 + 2
  const double amax[2] = {0.07, 0.04};  // group 1 holds columns 128, 129 (0.03, 0.04)
  for (int64_t g = 0; g < 2; ++g) {
    const double s = q.scales(0, g);
    EXPECT_EQ(s, std::exp2(std::ceil(std::log2(s))));  // a power of two
    EXPECT_GE(s * 448.0, amax[g] * (1 - 1e-6));        // rounded up, never down
    EXPECT_LT(s * 448.0, 2 * amax[g]);
  }
}

// ---------- random properties ----------

TEST(Fp8Property, DequantWithinHalfStepAllSchemes) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 200, 300);
  for (Dialect d : {Dialect::kIdeal, Dialect::kCompressedTensors, Dialect::kVllm}) {
    const auto req = request(w, d, DType::kF32);
    struct Case {
      const char* name;
      TensorMap t;
      Matrix deq;
      int64_t br, bc;
    };
    auto tt = quantize_fp8_tensor(req);
    auto tc = quantize_fp8_channel(req);
    auto tb = quantize_fp8_block(req);
    std::vector<Case> cases{{"tensor", tt, dequantize_fp8_tensor(tt), 200, 300},
                            {"channel", tc, dequantize_fp8_channel(tc), 1, 300},
                            {"block", tb, dequantize_fp8_block(tb), 128, 128}};
    for (const auto& c : cases) {
      const auto sc = decode(c.t.at("weight_scale").view(), "s");
      const int64_t tcols = (300 + c.bc - 1) / c.bc;
      for (int64_t r = 0; r < 200; ++r)
        for (int64_t k = 0; k < 300; ++k) {
          const double s = sc[static_cast<size_t>((r / c.br) * tcols + k / c.bc)];
          const double m = std::min(std::fabs(w(r, k)) / s, 448.0);
          const double tol = 0.5 * fp8_step(m) * s + std::fabs(w(r, k)) * 0x1p-20;
          ASSERT_LE(std::fabs(c.deq(r, k) - w(r, k)), tol)
              << c.name << " " << to_string(d) << " at " << r << "," << k << " "
              << test::seed_note(seed);
        }
    }
  }
}

TEST(Fp8Property, QuantizeIsIdempotentOnRepresentableValues) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::gaussian_matrix(rng, 64, 256);
  for (Dialect d : kAllDialects) {
    if (d == Dialect::kMsModelSlim) continue;
    const auto t1 = quantize_fp8_block(request(w, d, DType::kF32));
    const auto t2 = quantize_fp8_block(request(dequantize_fp8_block(t1), d, DType::kF32));
    EXPECT_EQ(dequantize_fp8_block(t2).data, dequantize_fp8_block(t1).data)
        << to_string(d) << " " << test::seed_note(seed);
  }
}

TEST(Fp8Property, ApplyEqualsQuantizedInputTimesDequantizedWeight) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  // K = 200: ragged 1x128 activation groups, which only ideal runs for fp8-block; the other
  // dialects' block layers take K = 256.
  const Matrix w200 = test::realistic_matrix(rng, 96, 200);
  const Matrix x200 = test::gaussian_matrix(rng, 5, 200);
  const Matrix w256 = test::realistic_matrix(rng, 96, 256);
  const Matrix x256 = test::gaussian_matrix(rng, 5, 256);
  std::vector<double> bias(96);
  for (auto& b : bias)
    b = std::normal_distribution<double>(0, 0.1)(rng);
  for (Dialect d : kAllDialects) {
    for (SchemeKind k : {SchemeKind::kFp8Tensor, SchemeKind::kFp8Channel, SchemeKind::kFp8Block}) {
      if (d == Dialect::kMsModelSlim && k != SchemeKind::kFp8Channel) continue;
      const bool aligned = k == SchemeKind::kFp8Block && d != Dialect::kIdeal;
      const Matrix& w = aligned ? w256 : w200;
      const Matrix& x = aligned ? x256 : x200;
      auto req = request(w, d);
      req.bias = bias;
      const auto shape =
          LinearShape::dense("model.layers.0.mlp.down_proj", 96, w.cols, DType::kBF16, true);
      std::unique_ptr<LinearMethod> m;
      TensorMap t;
      if (k == SchemeKind::kFp8Tensor) {
        req.activations = ActivationStats{-3.0, 3.5, {}};
        t = quantize_fp8_tensor(req);
        m = make_fp8_tensor_method(shape, config(k, d, qargs(kStatic)));
      } else if (k == SchemeKind::kFp8Channel) {
        t = quantize_fp8_channel(req);
        m = make_fp8_channel_method(
            shape, config(k, d, qargs(kToken), d == Dialect::kMsModelSlim ? "msmodelslim" : ""));
      } else {
        t = quantize_fp8_block(req);
        m = make_fp8_block_method(shape, config(k, d, qargs(kGroup)));
      }
      m->load_all(t);
      m->process_weights_after_loading();
      const Matrix y = m->apply(x);
      const auto xq = m->quantize_input(x);
      ASSERT_TRUE(xq.has_value());
      Matrix ref = matmul_nt(dequantize(*xq), m->dequantized_weight());
      const auto stored_bias = decode(t.at("bias").view(), "bias");  // bf16 / F32 as written
      for (int64_t r = 0; r < ref.rows; ++r)
        for (int64_t n = 0; n < ref.cols; ++n)
          ref(r, n) += stored_bias[static_cast<size_t>(n)];
      EXPECT_LT(test::relative_l2(y, ref), 1e-12)
          << to_string(d) << " " << to_string(SchemeId{k, 0}) << " " << test::seed_note(seed);
    }
  }
}

// ---------- exact accumulation ----------

TEST(Fp8Gemm, PerTileAccumulationIsExact) {
  // Adversarial: every code 448 (the max), K = 1000 (8 ragged tiles). Each product 448*448 =
  // 200704 lies on the 2^-18 lattice; the per-tile sums are exact integers in int64.
  Matrix w(3, 1000, 448.0);
  auto t = quantize_fp8_block(request(w, Dialect::kIdeal, DType::kF32));
  auto m = make_fp8_block_method(LinearShape::dense("l", 3, 1000, DType::kF32),
                                 config(SchemeKind::kFp8Block, Dialect::kIdeal, qargs(kGroup)));
  m->load_all(t);
  m->process_weights_after_loading();
  Matrix x(2, 1000, -448.0);
  const Matrix y = m->apply(x);
  for (double v : y.data)
    EXPECT_EQ(v, -448.0 * 448.0 * 1000.0);
  // Random codes: scaled_gemm equals an int64 per-tile reference exactly.
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  QuantizedMatrix a, b;
  for (QuantizedMatrix* q : {&a, &b}) {
    q->rows = 4;
    q->cols = 300;
    q->lattice = kFp8Lattice;
    q->block_rows = 1;
    q->block_cols = 128;
    q->scales = Matrix(4, 3);
    for (auto& s : q->scales.data)
      s = std::ldexp(1.0, byte(rng) % 9 - 4);
    for (int i = 0; i < 1200; ++i) {
      uint8_t c = static_cast<uint8_t>(byte(rng));
      if ((c & 0x7F) == 0x7F) c = 0x7E;
      q->codes.push_back(lattice_code(codec::e4m3fn_to_double(c), kFp8Lattice));
    }
  }
  const Matrix y2 = scaled_gemm(a, b);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      double acc = 0;
      for (int64_t seg = 0; seg < 3; ++seg) {
        int64_t dot = 0;
        for (int64_t k = seg * 128; k < std::min<int64_t>(300, seg * 128 + 128); ++k)
          dot += a.code(i, k) * b.code(j, k);
        acc += static_cast<double>(dot) * 0x1p-18 * a.scales(i, seg) * b.scales(j, seg);
      }
      EXPECT_EQ(y2(i, j), acc) << test::seed_note(seed);
    }
}

// ---------- fused partitions and MoE ----------

TEST(Fp8Tensor, W13UnificationWithinOneStep) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const int64_t E = 2, I = 24, H = 40;
  LinearShape sh;
  sh.prefix = "model.layers.0.mlp.experts";
  sh.partition_names = {"gate_proj", "up_proj"};
  sh.partitions = {I, I};
  sh.in_features = H;
  sh.num_experts = E;
  for (Dialect d : {Dialect::kVllm, Dialect::kSglang, Dialect::kIdeal}) {
    auto m = make_fp8_tensor_method(sh, config(SchemeKind::kFp8Tensor, d, qargs(kStatic)));
    std::vector<Matrix> orig;
    for (int64_t e = 0; e < E; ++e) {
      Matrix fused(2 * I, H);
      for (int64_t p = 0; p < 2; ++p) {
        auto req =
            request(test::realistic_matrix(rng, I, H, 0.02 * static_cast<double>(1 + 3 * p)), d);
        req.activations = ActivationStats{-1.0, 2.0 + static_cast<double>(e), {}};
        const auto t = quantize_fp8_tensor(req);
        m->load_all(t, p, e);
        const Matrix dq = dequantize_fp8_tensor(t);
        std::copy(dq.data.begin(), dq.data.end(), fused.data.begin() + p * I * H);
      }
      orig.push_back(fused);
    }
    m->process_weights_after_loading();
    const TensorMap rt = m->runtime_tensors();
    EXPECT_EQ(rt.at("w13_weight").shape, (std::vector<int64_t>{E, 2 * I, H}));
    EXPECT_EQ(rt.at("w13_weight_scale").shape, (std::vector<int64_t>{E}));
    EXPECT_EQ(rt.at("w13_input_scale").shape, (std::vector<int64_t>{1}));
    // input scale: max over experts of bf16(3/448) -> expert 1's.
    EXPECT_EQ(decode(rt.at("w13_input_scale").view(), "i")[0],
              codec::round_to(codec::kBF16, static_cast<float>(3.0 / 448.0),
                              codec::Overflow::kNonSaturating));
    const auto scales = decode(rt.at("w13_weight_scale").view(), "s");
    for (int64_t e = 0; e < E; ++e) {
      const Matrix now = m->dequantized_weight(e);
      const double s = scales[static_cast<size_t>(e)];
      for (size_t i = 0; i < now.data.size(); ++i) {
        const double old = orig[static_cast<size_t>(e)].data[i];
        ASSERT_LE(std::fabs(now.data[i] - old), fp8_step(std::fabs(old) / s) * s * (1 + 1e-12))
            << to_string(d) << " expert " << e << " element " << i << " " << test::seed_note(seed);
      }
    }
  }
}

TEST(Fp8Tensor, RequantThroughFp16DiffersFromExact) {
  // vLLM's per_tensor_dequantize keeps q*s_i in fp16: q = 2^-9 with s_i = 2^-17 gives 2^-26,
  // below fp16's smallest subnormal 2^-24, so it becomes 0 and requantizes to code 0; the exact
  // path keeps q.
  const Fp8Rules v = fp8_rules(Dialect::kVllm), id = fp8_rules(Dialect::kIdeal);
  EXPECT_EQ(fp8_requantize(0x1p-9, 0x1p-17, 0x1p-17, id), 0x1p-9);
  EXPECT_EQ(fp8_requantize(0x1p-9, 0x1p-17, 0x1p-17, v), 0.0);
}

// ---------- ragged block edges and constraints ----------

TEST(Fp8Block, RaggedEdgesAndFormatFp8ScaleInv) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  const Matrix w = test::realistic_matrix(rng, 200, 300);
  Fp8QuantizeOptions o;
  o.file = Fp8File::kFp8Config;
  const auto t = quantize_fp8_block(request(w, Dialect::kIdeal), o);
  ASSERT_TRUE(t.count("weight_scale_inv"));
  EXPECT_EQ(t.at("weight_scale_inv").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.at("weight_scale_inv").dtype, DType::kF32);
  // The partial tile (rows 128..199, cols 256..299) takes its amax from existing elements only.
  double amax = 0;
  for (int64_t r = 128; r < 200; ++r)
    for (int64_t c = 256; c < 300; ++c)
      amax = std::max(amax, std::fabs(w(r, c)));
  EXPECT_EQ(decode(t.at("weight_scale_inv").view(), "s")[5],
            static_cast<double>(static_cast<float>(amax / 448.0)));
  // ideal: vLLM's group kernel would refuse K = 300 for its 1x128 activation groups.
  auto m =
      make_fp8_block_method(LinearShape::dense("model.layers.0.o_proj", 200, 300),
                            config(SchemeKind::kFp8Block, Dialect::kIdeal, qargs(kGroup), "fp8"));
  m->load_all(t);
  m->process_weights_after_loading();
  EXPECT_EQ(m->dequantized_weight().data, dequantize_fp8_block(t).data);
  // A compressed-tensors name in a quant_method "fp8" layer is rejected by name.
  auto m2 =
      make_fp8_block_method(LinearShape::dense("model.layers.0.o_proj", 200, 300),
                            config(SchemeKind::kFp8Block, Dialect::kVllm, qargs(kGroup), "fp8"));
  EXPECT_THAT(error_of([&] { m2->load("weight_scale", t.at("weight_scale_inv").view()); }),
              HasSubstr("model.layers.0.o_proj.weight_scale"));
}

TEST(Fp8Block, RaggedTilesAndGroupsHandWorked) {
  // N = K = 130: tiles [0..127] and the ragged [128..129] on both axes. Every tile's amax is
  // 448 * 2^e, so each scale is a power of two and every code exact. A tile's scale must come
  // from its own partial block: tile (0, 1) sits beside tile (0, 0) with a 128x larger amax.
  Matrix w(130, 130, 0.0);
  w(0, 0) = 28.0;          // tile (0,0): s = 28/448 = 2^-4, code 448 (0x7E)
  w(1, 1) = -3.0;          // -3/2^-4 = -48 = -1.5*2^5 -> 0xE4
  w(0, 128) = 3.5;         // tile (0,1), 2 columns: s = 2^-7, code 448 (0x7E)
  w(5, 129) = -1.0;        // -128 -> 0xF0
  w(129, 7) = 0.875;       // tile (1,0), 2 rows: s = 2^-9, code 448
  w(128, 0) = 0.25;        // 128 -> 0x70
  w(129, 129) = -7.0;      // corner tile (1,1), 2x2: s = 2^-6, code -448 (0xFE)
  w(128, 128) = 0.109375;  // 7 = 1.75*2^2 -> 0x4E
  const auto t = quantize_fp8_block(request(w, Dialect::kIdeal, DType::kF32));
  ASSERT_EQ(t.at("weight_scale").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t.at("weight_scale").dtype, DType::kF32);  // the model dtype
  EXPECT_EQ(decode(t.at("weight_scale").view(), "s"),
            (std::vector<double>{0x1p-4, 0x1p-7, 0x1p-9, 0x1p-6}));
  const std::vector<uint8_t>& q = t.at("weight").bytes;
  auto code = [&](int64_t r, int64_t c) { return q[static_cast<size_t>(r * 130 + c)]; };
  EXPECT_EQ(code(0, 0), 0x7E);
  EXPECT_EQ(code(1, 1), 0xE4);
  EXPECT_EQ(code(0, 128), 0x7E);
  EXPECT_EQ(code(5, 129), 0xF0);
  EXPECT_EQ(code(129, 7), 0x7E);
  EXPECT_EQ(code(128, 0), 0x70);
  EXPECT_EQ(code(129, 129), 0xFE);
  EXPECT_EQ(code(128, 128), 0x4E);
  EXPECT_EQ(code(2, 2), 0x00);
  EXPECT_EQ(dequantize_fp8_block(t).data, w.data);  // every value representable: exact

  // Activations, 1x128 groups with a ragged last group of 2 columns: s0 = 56/448 = 2^-3,
  // s1 = 0.4375/448 = 2^-10 (its own amax, not group 0's).
  Matrix x(1, 130, 0.0);
  x(0, 3) = 56.0;
  x(0, 128) = 0.0625;  // 64 -> 0x68
  x(0, 129) = -0.4375;
  const LinearShape shape =
      LinearShape::dense("model.layers.0.mlp.down_proj", 130, 130, DType::kF32);
  auto m =
      make_fp8_block_method(shape, config(SchemeKind::kFp8Block, Dialect::kIdeal, qargs(kGroup)));
  m->load_all(t);
  m->process_weights_after_loading();
  const auto xq = m->quantize_input(x);
  ASSERT_TRUE(xq.has_value());
  ASSERT_EQ(xq->scales.cols, 2);
  EXPECT_EQ(xq->scales(0, 0), 0x1p-3);
  EXPECT_EQ(xq->scales(0, 1), 0x1p-10);
  EXPECT_EQ(static_cast<double>(xq->code(0, 128)) * xq->lattice, 64.0);
  EXPECT_EQ(static_cast<double>(xq->code(0, 129)) * xq->lattice, -448.0);
  EXPECT_EQ(dequantize(*xq).data, x.data);
  // y = x W^T, exact: rows 0, 5, 128, 129 meet the nonzero x columns 128 and 129.
  const Matrix y = m->apply(x);
  for (int64_t n = 0; n < 130; ++n) {
    const double want = n == 0     ? 0.0625 * 3.5
                        : n == 5   ? 0.4375
                        : n == 128 ? 0.0625 * 0.109375
                        : n == 129 ? 3.0625
                                   : 0.0;
    EXPECT_EQ(y(0, n), want) << n;
  }

  // The dialects whose group kernels need K % 128 refuse the shape before any weight, naming
  // the tensor, the rule and its source; ideal takes it.
  const std::pair<Dialect, const char*> refusing[] = {
      {Dialect::kVllm, "per_token_group_quant_fp8"},
      {Dialect::kSglang, "per_token_group_quant_fp8"},
      {Dialect::kCompressedTensors, "compute_dynamic_scales_and_zp"}};
  for (const auto& [d, source] : refusing) {
    auto dm = make_fp8_block_method(shape, config(SchemeKind::kFp8Block, d, qargs(kGroup)));
    const std::string e = error_of([&] { dm->check_shape(); });
    EXPECT_THAT(e, HasSubstr("model.layers.0.mlp.down_proj.weight: fp8-block under the " +
                             std::string(to_string(d)) + " dialect"));
    EXPECT_THAT(e, HasSubstr("needs K = 130 divisible by 128"));
    EXPECT_THAT(e, HasSubstr(source));
  }
  EXPECT_NO_THROW(
      make_fp8_block_method(shape, config(SchemeKind::kFp8Block, Dialect::kIdeal, qargs(kGroup)))
          ->check_shape());
}

TEST(Fp8Block, MergedPartitionMustBeBlockAligned) {
  LinearShape sh;
  sh.prefix = "model.layers.0.self_attn";
  sh.partition_names = {"q_proj", "k_proj"};
  sh.partitions = {100, 128};
  sh.in_features = 256;
  std::mt19937_64 rng(1);
  auto load = [&](LinearMethod& m) {
    for (int64_t p = 0; p < 2; ++p)
      m.load_all(quantize_fp8_block(
                     request(test::gaussian_matrix(rng, sh.partitions[p], 256), Dialect::kVllm)),
                 p);
  };
  auto vm = make_fp8_block_method(sh, config(SchemeKind::kFp8Block, Dialect::kVllm, qargs(kGroup)));
  load(*vm);
  EXPECT_THAT(error_of([&] { vm->process_weights_after_loading(); }),
              HasSubstr("model.layers.0.self_attn.q_proj.weight_scale"));
  // ideal accepts any shape; the last partition may be ragged in vllm.
  auto im =
      make_fp8_block_method(sh, config(SchemeKind::kFp8Block, Dialect::kIdeal, qargs(kGroup)));
  load(*im);
  EXPECT_NO_THROW(im->process_weights_after_loading());
  sh.partitions = {128, 100};
  auto vm2 =
      make_fp8_block_method(sh, config(SchemeKind::kFp8Block, Dialect::kVllm, qargs(kGroup)));
  load(*vm2);
  EXPECT_NO_THROW(vm2->process_weights_after_loading());
}

TEST(Fp8Block, SglangMoeNeedsAlignedIntermediate) {
  LinearShape sh;
  sh.prefix = "model.layers.0.mlp.experts";
  sh.partition_names = {"gate_proj", "up_proj"};
  sh.partitions = {96, 96};
  sh.in_features = 256;
  sh.num_experts = 2;
  std::mt19937_64 rng(2);
  auto m =
      make_fp8_block_method(sh, config(SchemeKind::kFp8Block, Dialect::kSglang, qargs(kGroup)));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t p = 0; p < 2; ++p)
      m->load_all(
          quantize_fp8_block(request(test::gaussian_matrix(rng, 96, 256), Dialect::kSglang)), p, e);
  EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
              HasSubstr("model.layers.0.mlp.experts.0.gate_proj.weight_scale"));
  // Aligned I works and gives the SGLang run-time scale shape [E, 2*ceil(I/128), ceil(H/128)].
  sh.partitions = {128, 128};
  auto ok =
      make_fp8_block_method(sh, config(SchemeKind::kFp8Block, Dialect::kSglang, qargs(kGroup)));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t p = 0; p < 2; ++p)
      ok->load_all(
          quantize_fp8_block(request(test::gaussian_matrix(rng, 128, 256), Dialect::kSglang)), p,
          e);
  ok->process_weights_after_loading();
  EXPECT_EQ(ok->runtime_tensors().at("w13_weight_scale").shape, (std::vector<int64_t>{2, 2, 2}));
}

TEST(Fp8Channel, MsModelSlimOffsetMustBeZeroAndNaNBytesRejected) {
  std::mt19937_64 rng(3);
  auto req = request(test::gaussian_matrix(rng, 8, 32), Dialect::kMsModelSlim);
  req.bias = std::vector<double>(8, 0.5);
  auto t = quantize_fp8_channel(req);
  EXPECT_EQ(t.at("weight_scale").dtype, DType::kF32);
  EXPECT_EQ(t.at("weight_offset").dtype, DType::kF32);
  EXPECT_EQ(t.at("bias").dtype, DType::kF32);
  const auto sh = LinearShape::dense("model.layers.1.mlp.up_proj", 8, 32, DType::kBF16, true);
  const auto cfg =
      config(SchemeKind::kFp8Channel, Dialect::kMsModelSlim, qargs(kToken), "msmodelslim");
  {
    auto bad = t;
    bad["weight_offset"] = encode(DType::kF32, {8, 1}, std::vector<double>{0, 0, 1, 0, 0, 0, 0, 0},
                                  Encoding::kExact, "o");
    auto m = make_fp8_channel_method(sh, cfg);
    m->load_all(bad);
    EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
                HasSubstr("model.layers.1.mlp.up_proj.weight_offset"));
  }
  {
    auto bad = t;
    bad["weight"].bytes[5] = 0x7F;  // NaN
    auto m = make_fp8_channel_method(sh, cfg);
    m->load_all(bad);
    EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
                HasSubstr("model.layers.1.mlp.up_proj.weight"));
  }
  {
    auto m = make_fp8_channel_method(sh, cfg);
    auto no_offset = t;
    no_offset.erase("weight_offset");
    m->load_all(no_offset);
    EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
                HasSubstr("model.layers.1.mlp.up_proj.weight_offset"));
  }
  // Static activations with channel weights are rejected.
  EXPECT_THAT(error_of([&] {
                make_fp8_channel_method(
                    sh, config(SchemeKind::kFp8Channel, Dialect::kVllm, qargs(kStatic)));
              }),
              HasSubstr("model.layers.1.mlp.up_proj"));
}

TEST(Fp8Tensor, NegativeScaleRejected) {
  Matrix w(2, 2, 1.0);
  auto t = quantize_fp8_tensor(request(w, Dialect::kCompressedTensors));
  t["weight_scale"] = encode(DType::kBF16, {1}, std::vector<double>{-0.5}, Encoding::kExact, "s");
  auto m = make_fp8_tensor_method(LinearShape::dense("model.layers.2.self_attn.o_proj", 2, 2),
                                  config(SchemeKind::kFp8Tensor, Dialect::kVllm, std::nullopt));
  m->load_all(t);
  EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
              HasSubstr("model.layers.2.self_attn.o_proj.weight_scale"));
}

// ---------- kv-fp8 ----------

TEST(KvFp8, StoreReadAndScales) {
  // quantize_kv_fp8 (compressed-tensors, bf16): k amax 3.5 -> 2^-7; v amax 0 -> eps 2^-7.
  const auto s = quantize_kv_fp8(3.5, 0.0, DType::kBF16, DType::kBF16, Dialect::kCompressedTensors);
  EXPECT_EQ(decode(s.at("k_scale").view(), "k")[0], 0x1p-7);
  EXPECT_EQ(decode(s.at("v_scale").view(), "v")[0], 0x1p-7);
  KvShape ks{"model.layers.0.self_attn", 2, 4, DType::kBF16};
  for (Dialect d : kAllDialects) {
    auto m = make_kv_fp8_method(ks, config(SchemeKind::kKvFp8, d, std::nullopt));
    m->load_all(s);
    m->process_weights_after_loading();
    Matrix x(1, 8);
    x.data = {1.0, -2.0, 0.5, 3.5, 0.0, 0.25, -3.5, 3.0};  // all exact at s = 2^-7
    EXPECT_EQ(m->round_trip(KvWhich::kKey, x).data, x.data) << to_string(d);
    Matrix big(1, 8, 3.6);  // 3.6/2^-7 = 460.8 -> 448 (saturates everywhere, <= 464)
    for (double v : m->round_trip(KvWhich::kKey, big).data)
      EXPECT_EQ(v, 3.5) << to_string(d);
    Matrix huge(1, 8, 10.0);  // 1280: SGLang's unclamped cast would store NaN
    if (d == Dialect::kSglang)
      EXPECT_THAT(error_of([&] { m->store(KvWhich::kKey, huge); }), HasSubstr("NaN"));
    else
      for (double v : m->round_trip(KvWhich::kKey, huge).data)
        EXPECT_EQ(v, 3.5);
  }
  // Older name accepted; missing scale named.
  auto m = make_kv_fp8_method(ks, config(SchemeKind::kKvFp8, Dialect::kVllm, std::nullopt));
  m->load("k_proj.output_scale", s.at("k_scale").view());
  EXPECT_THAT(error_of([&] { m->process_weights_after_loading(); }),
              HasSubstr("model.layers.0.self_attn.v_scale"));
}

TEST(KvFp8, PerHeadScalesStoreEachHeadOnItsOwnGrid) {
  // Two heads of head_dim 4: amax 3.5 and 0.875 (vllm, fp32 scales): 3.5/448 and 0.875/448.
  const auto s =
      quantize_kv_fp8_per_head({3.5, 0.875}, {1.0, 2.0}, DType::kF32, DType::kBF16, Dialect::kVllm);
  ASSERT_EQ(s.at("k_scale").shape, (std::vector<int64_t>{2, 1, 1}));
  const std::vector<double> ks_v = decode(s.at("k_scale").view(), "k");
  EXPECT_EQ(ks_v[0], static_cast<double>(3.5f / 448.0f));
  EXPECT_EQ(ks_v[1], static_cast<double>(0.875f / 448.0f));
  KvShape ks{"model.layers.0.self_attn", 2, 4, DType::kBF16};
  MethodConfig c = config(SchemeKind::kKvFp8, Dialect::kVllm, std::nullopt);
  c.scheme.kv_per_head = true;
  auto m = make_kv_fp8_method(ks, c);
  m->load_all(s);
  m->process_weights_after_loading();
  // The same values in both heads: head 1 saturates 3.5 at its own 448 * s1.
  Matrix x(1, 8);
  x.data = {0.3, 3.5, -0.5, 0.0, 0.3, 3.5, -0.5, 0.0};
  const QuantizedMatrix q = m->store(KvWhich::kKey, x);
  EXPECT_EQ(q.scale(0, 0), ks_v[0]);
  EXPECT_EQ(q.scale(0, 5), ks_v[1]);
  const Matrix r = m->read(KvWhich::kKey, q);
  EXPECT_EQ(r.data[1], 3.5);    // 448 * s0
  EXPECT_EQ(r.data[5], 0.875);  // saturated at 448 * s1
  // Each element is e4m3(fp32(x / s_h)) * s_h, head by head.
  for (int64_t ch = 0; ch < 8; ++ch) {
    const float sh = static_cast<float>(ks_v[static_cast<size_t>(ch / 4)]);
    const float quotient = static_cast<float>(x.data[static_cast<size_t>(ch)]) / sh;
    const double code = codec::round_to(codec::kE4M3FN, std::clamp(quotient, -448.f, 448.f),
                                        codec::Overflow::kSaturate);
    const float product = static_cast<float>(code) * sh;  // the fp32 read, then bf16
    EXPECT_EQ(r.data[static_cast<size_t>(ch)],
              codec::round_to(codec::kBF16, product, codec::Overflow::kNonSaturating))
        << "channel " << ch;
  }
  // A per-tensor [1] scale is refused for the per-head point, naming the tensor; [Hkv] accepted.
  auto wrong = make_kv_fp8_method(ks, c);
  EXPECT_THAT(
      error_of([&] {
        wrong->load(
            "k_scale",
            quantize_kv_fp8(1, 1, DType::kF32, DType::kBF16, Dialect::kVllm).at("k_scale").view());
      }),
      HasSubstr("model.layers.0.self_attn.k_scale"));
  HostTensor flat = s.at("k_scale");
  flat.shape = {2};
  auto alt = make_kv_fp8_method(ks, c);
  EXPECT_NO_THROW(alt->load("k_scale", flat.view()));
}

}  // namespace
}  // namespace qparity::reference
