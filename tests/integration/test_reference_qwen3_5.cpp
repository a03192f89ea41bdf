// Qwen3.5 (hybrid Gated DeltaNet / gated attention) in the fp64 reference, end to end on the
// tiny fixture: every catalog point of both layer kinds is recorded at its catalog width and
// finite; prefill equals token-by-token decode (the recurrent state and the conv window carry
// over); re-running a layer alone (bisect's path) gives the forward's bits; compressed-tensors
// weight schemes leave the Gated DeltaNet unquantized as the producers do; the loader names a
// missing or misshapen Gated DeltaNet tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

#include "../unit/error_of.h"
#include "../unit/quant_test_util.h"
#include "../unit/test_seed.h"
#include "core/capture/capture_points.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/calibration.h"
#include "reference_cpu/models/model_loader.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;

// Measured on the fixed fixture of FormatErrorsOnAFixedFixture (logits rel L2 against bf16).
constexpr double kFixedFp8Block = 0.06126;
constexpr double kFixedW4a16 = 0.2515;

class Qwen3_5Reference : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    seed_ = test::test_seed();
    root_ = fs::temp_directory_path() / ("qparity_qwen3_5_" + std::to_string(seed_));
    fs::create_directories(root_);
    fixtures::FixtureSpec spec;
    spec.arch = Arch::kQwen3_5;
    spec.seed = seed_;
    fixtures::write_fp_checkpoint(spec, root_ / "fp", OverwritePolicy::kRefuse);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path fp() { return root_ / "fp"; }
  static std::vector<int64_t> tokens(int64_t n, int64_t vocab) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < n; ++i)
      t.push_back((i * 7919 + static_cast<int64_t>(seed_ % 97)) % vocab);
    return t;
  }
  // `from` (default: the suite's fixture) quantized into `scheme`, calibrated on tokens of
  // `seed` (default: the suite's).
  static fs::path quantized(const std::string& scheme, const fs::path& from = {},
                            std::optional<uint64_t> seed = std::nullopt) {
    const fs::path in = from.empty() ? fp() : from;
    const fs::path out = root_ / (in.filename().string() + "." + scheme);
    if (fs::exists(out)) return out;
    const ModelConfig cfg = load_model_config(in / "config.json");
    fixtures::quantize_checkpoint(
        in, parse_scheme_id(scheme), Dialect::kIdeal, out,
        fixtures::calibrate_checkpoint(in, synthetic_tokens(16, cfg.vocab, seed.value_or(seed_))),
        OverwritePolicy::kRefuse, nullptr);
    return out;
  }

  static inline uint64_t seed_ = 0;
  static inline fs::path root_;
};

TEST_F(Qwen3_5Reference, EveryCatalogPointAtItsWidthAndFinite) {
  for (const PrecisionMode mode : {PrecisionMode::kExact, PrecisionMode::kEmulate}) {
    LoadOptions o;
    o.mode = mode;
    auto m = load_model(fp(), o);
    const ModelConfig& cfg = m->config();
    ASSERT_TRUE(cfg.is_linear_attention_layer(0));
    ASSERT_FALSE(cfg.is_linear_attention_layer(1));
    Trace trace;
    ForwardHooks hooks;
    hooks.trace = &trace;
    m->forward(tokens(7, cfg.vocab), hooks);
    const std::vector<std::string> points = model_capture_points(cfg);
    EXPECT_EQ(trace.points().size(), points.size());
    for (const std::string& p : points) {
      ASSERT_TRUE(trace.find(p)) << to_string(mode) << " lacks " << p;
      const Matrix& x = trace.at(p);
      EXPECT_EQ(x.rows, 7) << p;
      EXPECT_EQ(x.cols, capture_point_width(cfg, p)) << p;
      for (double v : x.data)
        ASSERT_TRUE(std::isfinite(v)) << p;
    }
    // The gate moved the attention output; beta lies in (0, 1), the decay is negative.
    EXPECT_GT(test::relative_l2(trace.at("layers.1.attn.gated"), trace.at("layers.1.attn.core")),
              0.1);
    // sigmoid(b) in [0, 1]: the fixture's outlier input channels drive some b past 37, where
    // sigmoid is 1.0 even in fp64 (and bf16 saturates sooner); most gates stay inside.
    int64_t inside = 0;
    const auto& beta = trace.at("layers.0.linear_attn.beta").data;
    for (double b : beta) {
      EXPECT_TRUE(b >= 0.0 && b <= 1.0)
          << to_string(mode) << " beta " << b << ", " << test::seed_note(seed_);
      inside += b > 0.0 && b < 1.0;
    }
    EXPECT_GT(2 * inside, static_cast<int64_t>(beta.size())) << test::seed_note(seed_);
    for (double g : trace.at("layers.0.linear_attn.decay").data)
      EXPECT_LT(g, 0.0);
  }
}

TEST_F(Qwen3_5Reference, PrefillEqualsTokenByTokenDecode) {
  for (const std::string dir : {"fp", "kv-fp8"}) {
    const fs::path d = dir == "fp" ? fp() : quantized(dir);
    auto prefill = load_model(d);
    auto decode = load_model(d);
    const auto t = tokens(9, prefill->config().vocab);
    Trace whole, steps;
    ForwardHooks hw, hs;
    hw.trace = &whole;
    hs.trace = &steps;
    const Matrix a = prefill->forward(t, hw);
    Matrix b(0, a.cols);
    for (size_t i = 0; i < t.size(); ++i) {
      const Matrix step = decode->forward(std::span<const int64_t>(t).subspan(i, 1), hs);
      b.data.insert(b.data.end(), step.data.begin(), step.data.end());
      b.rows += 1;
    }
    // The same operations in the same order: the bits, at every capture point (the rows of the
    // decode steps accumulate, one per token) including the recurrent state after each token.
    EXPECT_EQ(b.data, a.data) << dir;
    ASSERT_EQ(steps.points().size(), whole.points().size());
    for (const auto& [name, x] : whole.points())
      EXPECT_EQ(steps.at(name).data, x.data) << dir << " " << name;
    EXPECT_EQ(decode->cached_tokens(), 9);
    // A second sequence starts from a fresh state.
    decode->reset_cache();
    const Matrix again = decode->forward(t);
    EXPECT_EQ(again.data, a.data) << dir;
  }
}

TEST_F(Qwen3_5Reference, ALayerReRunAloneGivesTheForwardsBits) {
  auto m = load_model(fp());
  const auto t = tokens(6, m->config().vocab);
  Trace trace;
  ForwardHooks hooks;
  hooks.trace = &trace;
  m->forward(t, hooks);
  std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  for (int64_t layer : {0, 1}) {
    m->reset_layer_cache(layer);
    const Matrix out = m->forward_layer(layer, trace.at(layer_input_point(layer)), pos);
    EXPECT_EQ(out.data, trace.at(point_of(layer_prefix(layer), point::kResidual)).data)
        << "layer " << layer;
  }
}

TEST_F(Qwen3_5Reference, WeightSchemesLeaveTheGatedDeltaNetUnquantized) {
  auto ref = load_model(fp());
  const auto t = tokens(6, ref->config().vocab);
  const Matrix base = ref->forward(t);
  for (const std::string scheme : {"fp8-block", "w4a16-g32"}) {
    const fs::path dir = quantized(scheme);
    const auto f = SafetensorsFile::open(dir / "model.safetensors");
    bool any_quantized = false;
    for (const auto& info : f.tensors()) {
      if (info.name.find(".linear_attn.") != std::string::npos) {
        EXPECT_EQ(info.dtype, DType::kBF16) << scheme << " " << info.name;
      }
      any_quantized = any_quantized || info.name.find("weight_scale") != std::string::npos ||
                      info.name.find("weight_packed") != std::string::npos;
    }
    EXPECT_TRUE(any_quantized) << scheme;
    auto m = load_model(dir);
    for (const auto& e : m->plan().entries()) {
      if (e.prefix.find(".linear_attn.") != std::string::npos) {
        EXPECT_FALSE(e.quantized()) << scheme << " " << e.prefix;
      }
    }
    EXPECT_GT(test::relative_l2(m->forward(t), base), 0.0) << scheme;
  }
}

// How far each format moves the logits is the random model's own amplification (a bound that
// held for every seed would say nothing: a stress run found w4a16-g32 at 1.58 against a 1.5
// guess), so it is checked on one fixed fixture (seed 7, fixed tokens): 8-bit codes with
// 128-wide blocks below 4-bit groups of 32, each at its measured value to 10%.
TEST_F(Qwen3_5Reference, FormatErrorsOnAFixedFixture) {
  fixtures::FixtureSpec spec;
  spec.arch = Arch::kQwen3_5;
  spec.seed = 7;
  const fs::path fixed = root_ / "fixed7";
  if (!fs::exists(fixed)) fixtures::write_fp_checkpoint(spec, fixed, OverwritePolicy::kRefuse);
  auto ref = load_model(fixed);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 6; ++i)
    t.push_back((i * 7919 + 7) % ref->config().vocab);
  const Matrix base = ref->forward(t);
  const double fp8_block =
      test::relative_l2(load_model(quantized("fp8-block", fixed, 7))->forward(t), base);
  const double w4a16 =
      test::relative_l2(load_model(quantized("w4a16-g32", fixed, 7))->forward(t), base);
  EXPECT_LT(fp8_block, w4a16);
  EXPECT_NEAR(fp8_block, kFixedFp8Block, 0.1 * kFixedFp8Block);
  EXPECT_NEAR(w4a16, kFixedW4a16, 0.1 * kFixedW4a16);
  std::cout << "fixed fixture logits rel L2: fp8-block " << fp8_block << ", w4a16-g32 " << w4a16
            << "\n";
}

TEST_F(Qwen3_5Reference, LoaderNamesAMissingOrMisshapenGatedDeltaNetTensor) {
  const auto f = SafetensorsFile::open(fp() / "model.safetensors");
  auto rewrite = [&](const std::string& dir, const std::string& drop, const std::string& reshape) {
    const fs::path d = root_ / dir;
    fs::create_directories(d);
    fs::copy_file(fp() / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
    std::vector<TensorToWrite> w;
    for (const auto& info : f.tensors()) {
      if (info.name == drop) continue;
      std::vector<uint64_t> shape = info.shape;
      if (info.name == reshape) shape = {shape[0] * shape[1] * shape[2]};
      const auto b = f.bytes(info);
      w.push_back({info.name, info.dtype, shape, {b.begin(), b.end()}});
    }
    write_safetensors(d / "model.safetensors", std::move(w), std::nullopt,
                      OverwritePolicy::kReplace);
    return d;
  };
  const std::string missing = test::error_of(
      [&] { load_model(rewrite("no_alog", "model.layers.0.linear_attn.A_log", "")); });
  EXPECT_NE(missing.find("model.layers.0.linear_attn.A_log"), std::string::npos) << missing;
  EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
  const std::string shape = test::error_of(
      [&] { load_model(rewrite("flat_conv", "", "model.layers.0.linear_attn.conv1d.weight")); });
  EXPECT_NE(shape.find("model.layers.0.linear_attn.conv1d.weight"), std::string::npos) << shape;
}

}  // namespace
}  // namespace qparity::reference
