// Property test over compressed-tensors' integer weight space (pack-quantized: num_bits 2..8,
// strategy group (any group size dividing K) / channel / tensor, symmetric or asymmetric,
// actorder group or none), not over a list of presets: every run draws fresh points, writes each
// with quantize_checkpoint, reads it back through build_quant_plan and the method lifecycle,
// and holds what it finds against the format's formulas, decoded here independently of the
// codecs (FORMATS.md §2.2-2.6; compressed-tensors' pack_to_int32 and calculate_qparams):
//   * the config block names the point (num_bits, type, symmetric, strategy, group_size,
//     actorder, format) and the plan gives every linear that point back;
//   * the tensors are the ones the point implies (weight_packed [N, ceil(K*b/32)] I32,
//     weight_scale [N, G], weight_shape, weight_zero_point packed along N for asym,
//     weight_g_idx for actorder) and nothing else;
//   * dequantized_weight equals (q - z) * s[group(k)] computed from the raw tensors, exactly;
//   * the scale is amax / ((2^b-1)/2) (sym) or (max(x,0) - min(x,0)) / (2^b-1) (asym) over the
//     group's columns, to the scale dtype's rounding;
//   * ideal dialect: every code is round-half-even(clamp(w/s + z)) of the exact quotient (the
//     property the ideal dialect promises); compressed-tensors' bf16 arithmetic within one step.
// A failure prints the seed (QPARITY_TEST_SEED replays it) and the point's id.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/json_util.h"
#include "core/safetensors/checkpoint.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/calibration.h"
#include "schemes/description/module_names.h"
#include "schemes/description/quant_plan.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/method/method_factory.h"
#include "schemes/method/tensor_decode.h"
#include "scratch_dir.h"
#include "test_seed.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

std::vector<int64_t> shape_of(const TensorRef& t) {
  return {t.info->shape.begin(), t.info->shape.end()};
}

std::vector<double> decoded(const TensorRef& t) {
  return reference::decode_all(t.info->dtype, t.bytes(), t.info->numel(), "");
}

std::vector<int32_t> int32s(const TensorRef& t) {
  EXPECT_EQ(t.info->dtype, DType::kI32);
  std::vector<int32_t> v(sz(t.info->numel()));
  std::memcpy(v.data(), t.bytes().data(), v.size() * 4);
  return v;
}

// Value i of a little-endian bit stream of b-bit fields (pack_to_int32's layout; for b in 2, 4, 8
// the same as 32/b fields per word).
int64_t field(const std::vector<uint32_t>& words, int64_t i, int b) {
  int64_t u = 0;
  for (int bit = 0; bit < b; ++bit) {
    const int64_t pos = i * b + bit;
    if ((words[sz(pos / 32)] >> (pos % 32)) & 1u) u |= int64_t{1} << bit;
  }
  return u;
}

// An independent bf16 rounding of a double, round-half-even, in one step (through fp32 it would
// round twice and could land one ulp off the ideal dialect's exact-then-once scale). Normal range.
double to_bf16(double v) {
  if (v == 0.0) return 0.0;
  int e = 0;
  const double m = std::frexp(v, &e);                          // v = m * 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);  // 8 significant bits, RNE
}

struct Point {
  IntWeightPoint w;
  Dialect dialect = Dialect::kIdeal;
};

std::string id_of(const Point& p) {
  return to_string(SchemeId{SchemeKind::kPackedInt, 0, p.w}) + " under " +
         std::string(to_string(p.dialect));
}

Point draw(std::mt19937_64& rng, int64_t k_gcd) {
  std::vector<int64_t> groups;
  for (int64_t g = 4; g <= k_gcd; ++g)
    if (k_gcd % g == 0) groups.push_back(g);
  Point p;
  p.w.bits = std::uniform_int_distribution<int>(2, 8)(rng);
  const int strategy = std::uniform_int_distribution<int>(0, 3)(rng);  // group twice as likely
  p.w.group = strategy == 2 ? IntWeightPoint::kChannel
              : strategy == 3
                  ? IntWeightPoint::kTensor
                  : groups[std::uniform_int_distribution<size_t>(0, groups.size() - 1)(rng)];
  p.w.symmetric = std::bernoulli_distribution(0.5)(rng);
  p.w.actorder = p.w.group > 0 && std::bernoulli_distribution(0.4)(rng);
  p.dialect = std::bernoulli_distribution(0.5)(rng) ? Dialect::kIdeal : Dialect::kCompressedTensors;
  return p;
}

class PackedIntSpace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = new test::ScratchDir("qparity_packed_int_space");
    fp_ = scratch_->path() / "fp";
    fixtures::write_fp_checkpoint({Arch::kLlama, fixtures::FixtureSize::kTiny, 11}, fp_,
                                  OverwritePolicy::kRefuse);
    const ModelConfig cfg = load_model_config(fp_ / "config.json");
    stats_ = new fixtures::StatsProviders(
        fixtures::calibrate_checkpoint(fp_, reference::synthetic_tokens(24, cfg.vocab, 3)));
  }
  static void TearDownTestSuite() {
    delete stats_;
    delete scratch_;
  }
  static test::ScratchDir* scratch_;
  static fs::path fp_;
  static fixtures::StatsProviders* stats_;
};
test::ScratchDir* PackedIntSpace::scratch_ = nullptr;
fs::path PackedIntSpace::fp_;
fixtures::StatsProviders* PackedIntSpace::stats_ = nullptr;

void check_config_block(const Json& config, const Point& p) {
  const Json& qc = config.at("quantization_config");
  EXPECT_EQ(qc.at("format"), "pack-quantized");
  const Json& w = qc.at("config_groups").at("group_0").at("weights");
  EXPECT_EQ(w.at("num_bits"), p.w.bits);
  EXPECT_EQ(w.at("type"), "int");
  EXPECT_EQ(w.at("symmetric"), p.w.symmetric);
  const char* strategy = p.w.group == IntWeightPoint::kChannel  ? "channel"
                         : p.w.group == IntWeightPoint::kTensor ? "tensor"
                                                                : "group";
  EXPECT_EQ(w.at("strategy"), strategy);
  if (p.w.group > 0)
    EXPECT_EQ(w.at("group_size"), p.w.group);
  else
    EXPECT_TRUE(!w.contains("group_size") || w.at("group_size").is_null());
  if (p.w.actorder)
    EXPECT_EQ(w.at("actorder"), "group");
  else
    EXPECT_TRUE(!w.contains("actorder") || w.at("actorder").is_null());
}

// One linear against the formulas; returns the number of codes at an exact-quotient near-tie
// (left to test_quant_exact_ties.cpp).
void check_linear(const Point& p, const LinearModule& l, const PlanEntry& e, const Checkpoint& q,
                  const Checkpoint& fp) {
  const int b = p.w.bits;
  const int64_t n_out = l.out_features, k_in = l.in_features;
  const int64_t groups = p.w.group > 0 ? k_in / p.w.group : 1;
  const std::string& pre = l.prefix;
  // Exactly the point's tensors.
  std::set<std::string> want = {pre + ".weight_packed", pre + ".weight_scale",
                                pre + ".weight_shape"};
  if (!p.w.symmetric) want.insert(pre + ".weight_zero_point");
  if (p.w.actorder) want.insert(pre + ".weight_g_idx");
  std::set<std::string> got;
  for (const auto& [name, ref] : q.tensors())
    if (name.rfind(pre + ".", 0) == 0) got.insert(name);
  EXPECT_EQ(got, want) << pre;
  if (got != want) return;

  const TensorRef& packed = q.at(pre + ".weight_packed");
  const int64_t cols = (k_in * b + 31) / 32;
  ASSERT_EQ(shape_of(packed), (std::vector<int64_t>{n_out, cols})) << pre;
  const std::vector<int32_t> pw = int32s(packed);
  const TensorRef& scale_t = q.at(pre + ".weight_scale");
  const std::vector<int64_t> scale_shape = p.w.group == IntWeightPoint::kTensor
                                               ? std::vector<int64_t>{1}
                                               : std::vector<int64_t>{n_out, groups};
  EXPECT_EQ(shape_of(scale_t), scale_shape) << pre;
  const std::vector<double> s = decoded(scale_t);
  const std::vector<double> shape = decoded(q.at(pre + ".weight_shape"));
  EXPECT_EQ(shape, (std::vector<double>{double(n_out), double(k_in)})) << pre;

  // Group of each column.
  std::vector<int64_t> g_of(sz(k_in));
  if (p.w.actorder) {
    const std::vector<int32_t> gi = int32s(q.at(pre + ".weight_g_idx"));
    ASSERT_EQ(gi.size(), sz(k_in));
    std::vector<int64_t> count(sz(groups), 0);
    for (int64_t k = 0; k < k_in; ++k) {
      ASSERT_GE(gi[sz(k)], 0);
      ASSERT_LT(gi[sz(k)], groups);
      g_of[sz(k)] = gi[sz(k)];
      ++count[sz(gi[sz(k)])];
    }
    for (int64_t c : count)  // the dequantizers' grouping needs full groups
      EXPECT_EQ(c, p.w.group) << pre;
  } else {
    for (int64_t k = 0; k < k_in; ++k)
      g_of[sz(k)] = p.w.group > 0 ? k / p.w.group : 0;
  }
  const auto scale_at = [&](int64_t n, int64_t g) {
    return p.w.group == IntWeightPoint::kTensor ? s[0] : s[sz(n * groups + g)];
  };

  // Zero points (asym): group / channel I32 [ceil(N*b/32), G], a stream along N per column;
  // tensor: I8 [1].
  const int64_t half = int64_t{1} << (b - 1);
  std::vector<int64_t> z(sz(n_out * groups), 0);
  if (!p.w.symmetric) {
    const TensorRef& zt = q.at(pre + ".weight_zero_point");
    if (p.w.group == IntWeightPoint::kTensor) {
      ASSERT_EQ(zt.info->dtype, DType::kI8);
      ASSERT_EQ(zt.info->numel(), 1);
      std::fill(z.begin(), z.end(), static_cast<int8_t>(zt.bytes()[0]));
    } else {
      const int64_t rows = (n_out * b + 31) / 32;
      ASSERT_EQ(shape_of(zt), (std::vector<int64_t>{rows, groups})) << pre;
      const std::vector<int32_t> zw = int32s(zt);
      for (int64_t g = 0; g < groups; ++g) {
        std::vector<uint32_t> stream(sz(rows));
        for (int64_t r = 0; r < rows; ++r)
          stream[sz(r)] = static_cast<uint32_t>(zw[sz(r * groups + g)]);
        for (int64_t n = 0; n < n_out; ++n)
          z[sz(n * groups + g)] = field(stream, n, b) - half;
      }
    }
  }

  // The method's dequantized weight against (q - z) * s from the raw tensors, exactly.
  reference::LinearShape ls = reference::LinearShape::dense(pre, n_out, k_in, DType::kBF16);
  auto method = reference::make_linear_method(ls, reference::method_config(e, p.dialect));
  for (const reference::ParamSpec& spec : method->create_weights(0)) {
    const std::string name = pre + "." + spec.name;
    if (!q.contains(name)) continue;
    const TensorRef& r = q.at(name);
    reference::TensorView v{r.info->dtype, shape_of(r), r.bytes()};
    method->load(spec.name, v, 0, 0);
  }
  method->process_weights_after_loading();
  const Matrix deq = method->dequantized_weight(0);
  const std::vector<double> w = decoded(fp.at(pre + ".weight"));
  const int64_t qmin = -half, qmax = half - 1;
  int64_t mismatched = 0, off_by_more = 0, near_ties = 0;
  double worst_scale = 0.0;
  for (int64_t n = 0; n < n_out; ++n) {
    std::vector<uint32_t> row(sz(cols));
    for (int64_t c = 0; c < cols; ++c)
      row[sz(c)] = static_cast<uint32_t>(pw[sz(n * cols + c)]);
    for (int64_t k = 0; k < k_in; ++k) {
      const int64_t code = field(row, k, b) - half;
      ASSERT_GE(code, qmin);
      ASSERT_LE(code, qmax);
      const int64_t g = g_of[sz(k)];
      const double sc = scale_at(n, g);
      const int64_t zp = z[sz(n * groups + g)];
      const double formula = static_cast<double>(code - zp) * sc;
      ASSERT_EQ(deq(n, k), formula) << pre << " [" << n << ", " << k << "]";
      // The code the point's rounding gives for the original weight with the stored scale.
      const long double t = static_cast<long double>(w[sz(n * k_in + k)]) / sc + zp;
      const long double clamped =
          std::clamp(t, static_cast<long double>(qmin), static_cast<long double>(qmax));
      const long double frac = clamped - std::floor(clamped);
      if (std::fabs(frac - 0.5L) < 1e-9L) {
        ++near_ties;
        continue;
      }
      const auto want_code = static_cast<int64_t>(std::nearbyint(clamped));
      if (want_code != code) ++mismatched;
      if (std::llabs(want_code - code) > 1) ++off_by_more;
    }
  }
  // The scale rule per group (over the group's columns, g_idx order for actorder).
  for (int64_t n = 0; n < (p.w.group == IntWeightPoint::kTensor ? 1 : n_out); ++n)
    for (int64_t g = 0; g < groups; ++g) {
      double lo = 0.0, hi = 0.0;  // calculate_qparams: min(x, 0), max(x, 0)
      for (int64_t r = 0; r < (p.w.group == IntWeightPoint::kTensor ? n_out : 1); ++r)
        for (int64_t k = 0; k < k_in; ++k) {
          if (g_of[sz(k)] != g) continue;
          const double v = w[sz((p.w.group == IntWeightPoint::kTensor ? r : n) * k_in + k)];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
      const double want_s = p.w.symmetric
                                ? std::max(-lo, hi) / (static_cast<double>((1 << b) - 1) / 2.0)
                                : (hi - lo) / static_cast<double>((1 << b) - 1);
      const double got_s = scale_at(n, g);
      worst_scale = std::max(worst_scale, std::fabs(got_s - to_bf16(want_s)) / want_s);
    }
  // bf16: the ideal dialect rounds the exact scale once; compressed-tensors' bf16 steps may land
  // one ulp (2^-7 relative) away.
  EXPECT_LE(worst_scale, p.dialect == Dialect::kIdeal ? 1e-12 : 1.0 / 64) << pre;
  if (p.dialect == Dialect::kIdeal) {
    EXPECT_EQ(mismatched, 0) << pre << ": codes not round-half-even of the exact quotient";
  }
  EXPECT_EQ(off_by_more, 0) << pre << ": codes more than one step from the formula";
}

TEST_F(PackedIntSpace, RandomPointsWriteReadAndDequantizeToTheFormula) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig cfg = load_model_config(fp_ / "config.json");
  const Checkpoint fp = Checkpoint::open(fp_);
  const QuantPlan fp_plan = build_quant_plan(cfg, fp_, std::nullopt);
  int64_t k_gcd = 0;
  for (const LinearModule& l : fp_plan.modules().linears())
    if (l.kind != LinearKind::kLmHead) k_gcd = std::gcd(k_gcd, l.in_features);
  ASSERT_GE(k_gcd, 8);
  constexpr int kPoints = 6;
  for (int i = 0; i < kPoints; ++i) {
    const Point p = draw(rng, k_gcd);
    SCOPED_TRACE(id_of(p));
    const SchemeId scheme{SchemeKind::kPackedInt, 0, p.w};
    // The id is a name of the point: it parses back to it.
    EXPECT_EQ(parse_scheme_id(to_string(scheme)), scheme);
    const fs::path out = scratch_->path() / ("q" + std::to_string(i));
    fixtures::quantize_checkpoint(fp_, scheme, p.dialect, out, *stats_, OverwritePolicy::kRefuse,
                                  nullptr);
    check_config_block(read_json_file(out / "config.json"), p);
    const QuantPlan plan = build_quant_plan(cfg, out, std::nullopt);
    EXPECT_TRUE(plan.warnings().empty());
    const Checkpoint q = Checkpoint::open(out);
    for (const LinearModule& l : plan.modules().linears()) {
      const PlanEntry& e = plan.method_for(l.prefix);
      if (l.kind == LinearKind::kLmHead || l.tied) {
        EXPECT_EQ(e.scheme_string(), "bf16") << l.prefix;
        continue;
      }
      ASSERT_TRUE(e.scheme.has_value()) << l.prefix;
      EXPECT_EQ(*e.scheme, scheme) << l.prefix;
      check_linear(p, l, e, q, fp);
      if (::testing::Test::HasFatalFailure()) return;
    }
    fs::remove_all(out);
  }
}

}  // namespace
}  // namespace qparity
