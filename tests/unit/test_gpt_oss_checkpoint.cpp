// gpt-oss checkpoints (core/safetensors/gpt_oss_names.h, fixtures/producer_naming.h): the expert
// stacks seen per expert (transpose, gate/up de-interleave, biases), the writer's inverse, the
// MXFP4 layout written by `quantize --format gpt-oss` read back bit for bit against
// compressed-tensors' per-expert mxfp4 tensors and against the e2m1 x E8M0 formula, the reader's
// refusals, and the model run by the reference (bf16 and MXFP4, prefill = decode).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/safetensors/chatglm_names.h"
#include "core/safetensors/gpt_oss_names.h"
#include "core/safetensors/safetensors_writer.h"
#include "error_of.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/causal_lm.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/fp4/mxfp4.h"
#include "scratch_dir.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using test::error_of;

const fs::path& gpt_oss_fixture() {
  static const fs::path d = [] {
    const fs::path p = test::scratch_dir("qparity_gpt_oss") / "bf16";
    fixtures::FixtureSpec spec;
    spec.arch = Arch::kGptOss;
    spec.seed = 7;
    fixtures::write_fp_checkpoint(spec, p, OverwritePolicy::kReplace);
    return p;
  }();
  return d;
}

const fs::path& mxfp4_fixture(const std::string& layout) {
  static std::map<std::string, fs::path> made;
  auto it = made.find(layout);
  if (it != made.end()) return it->second;
  const fs::path p =
      test::scratch_dir("qparity_gpt_oss") / ("mxfp4-" + (layout.empty() ? "ct" : layout));
  fixtures::QuantizeCheckpointOptions o;
  o.layout = layout;
  fixtures::quantize_checkpoint(gpt_oss_fixture(), parse_scheme_id("mxfp4a16"),
                                Dialect::kCompressedTensors, p, {}, OverwritePolicy::kReplace,
                                nullptr, o);
  return made.emplace(layout, p).first->second;
}

uint16_t u16_at(std::span<const uint8_t> b, uint64_t i) {
  uint16_t v;
  std::memcpy(&v, b.data() + i * 2, 2);
  return v;
}

TEST(GptOssCheckpoint, StacksAreSeenPerExpert) {
  const ModelConfig cfg = load_model_config(gpt_oss_fixture() / "config.json");
  const Checkpoint raw = Checkpoint::open(gpt_oss_fixture());
  const Checkpoint view = open_model_checkpoint(gpt_oss_fixture(), cfg);
  const uint64_t H = static_cast<uint64_t>(cfg.hidden),
                 I = static_cast<uint64_t>(cfg.moe_intermediate_size);
  const std::string s = "model.layers.1.mlp.experts";
  EXPECT_FALSE(view.contains(s + ".gate_up_proj"));
  EXPECT_TRUE(view.contains("model.layers.1.self_attn.sinks"));
  const auto gu = raw.at(s + ".gate_up_proj").bytes(), dn = raw.at(s + ".down_proj").bytes();
  const auto gub = raw.at(s + ".gate_up_proj_bias").bytes();
  for (uint64_t e : {0ull, 3ull}) {
    const std::string ep = s + "." + std::to_string(e);
    const auto g = view.at(ep + ".gate_proj.weight").bytes(),
               u = view.at(ep + ".up_proj.weight").bytes();
    const auto d = view.at(ep + ".down_proj.weight").bytes();
    EXPECT_EQ(view.at(ep + ".gate_proj.weight").info->shape, (std::vector<uint64_t>{I, H}));
    EXPECT_EQ(view.at(ep + ".down_proj.weight").info->shape, (std::vector<uint64_t>{H, I}));
    for (uint64_t i = 0; i < I; ++i)
      for (uint64_t h = 0; h < H; ++h) {
        ASSERT_EQ(u16_at(g, i * H + h), u16_at(gu, e * H * 2 * I + h * 2 * I + 2 * i));
        ASSERT_EQ(u16_at(u, i * H + h), u16_at(gu, e * H * 2 * I + h * 2 * I + 2 * i + 1));
        ASSERT_EQ(u16_at(d, h * I + i), u16_at(dn, e * I * H + i * H + h));
      }
    const auto gb = view.at(ep + ".gate_proj.bias").bytes(),
               ub = view.at(ep + ".up_proj.bias").bytes();
    for (uint64_t i = 0; i < I; ++i) {
      ASSERT_EQ(u16_at(gb, i), u16_at(gub, e * 2 * I + 2 * i));
      ASSERT_EQ(u16_at(ub, i), u16_at(gub, e * 2 * I + 2 * i + 1));
    }
  }
  EXPECT_NE(view.origin(s + ".2.up_proj.weight").find(s + ".gate_up_proj"), std::string::npos);
  EXPECT_EQ(view.disk_file(s + ".2.up_proj.weight").path(),
            raw.at(s + ".gate_up_proj").file->path());
}

TEST(GptOssCheckpoint, WriterIsTheReadersInverse) {
  const ModelConfig cfg = load_model_config(gpt_oss_fixture() / "config.json");
  const Checkpoint raw = Checkpoint::open(gpt_oss_fixture());
  const Checkpoint view = open_model_checkpoint(gpt_oss_fixture(), cfg);
  for (const std::string kind : {"weight", "bias"}) {
    std::vector<GptOssExpertTensors> ex;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      const std::string ep = "model.layers.0.mlp.experts." + std::to_string(e);
      auto bytes = [&](const std::string& p) {
        const auto b = view.at(ep + "." + p + "." + kind).bytes();
        return std::vector<uint8_t>(b.begin(), b.end());
      };
      ex.push_back({DType::kBF16, bytes("gate_proj"), bytes("up_proj"), bytes("down_proj")});
    }
    for (const GptOssStackTensor& t : gpt_oss_stack_tensors(cfg, 0, kind, ex)) {
      const auto want = raw.at(t.name).bytes();
      EXPECT_EQ(t.shape, raw.at(t.name).info->shape) << t.name;
      EXPECT_TRUE(std::equal(want.begin(), want.end(), t.bytes.begin(), t.bytes.end())) << t.name;
    }
  }
  std::vector<GptOssExpertTensors> short_list(1);
  EXPECT_NE(error_of([&] { gpt_oss_stack_tensors(cfg, 0, "weight", short_list); }).find("experts"),
            std::string::npos);
}

// quantize --format gpt-oss: gpt-oss's *_blocks / *_scales, read back per expert, are the bytes
// compressed-tensors' mxfp4 writes for the same expert (same rule), and dequantize by the formula.
TEST(GptOssCheckpoint, Mxfp4LayoutRoundTripsBitForBit) {
  const fs::path g = mxfp4_fixture("gpt-oss"), c = mxfp4_fixture("");
  const ModelConfig cfg = load_model_config(g / "config.json");
  const Checkpoint graw = Checkpoint::open(g);
  ASSERT_TRUE(graw.contains("model.layers.0.mlp.experts.gate_up_proj_blocks"));
  EXPECT_EQ(graw.at("model.layers.0.mlp.experts.gate_up_proj_blocks").info->shape,
            (std::vector<uint64_t>{4, 256, 4, 16}));
  EXPECT_FALSE(graw.contains("model.layers.0.mlp.experts.0.gate_proj.weight_packed"));
  EXPECT_EQ(read_json_file(g / "config.json").at("quantization_config").at("quant_method"),
            "mxfp4");
  const Checkpoint gv = open_model_checkpoint(g, cfg);
  const Checkpoint cv = open_model_checkpoint(c, load_model_config(c / "config.json"));
  const uint64_t H = static_cast<uint64_t>(cfg.hidden);
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer)
    for (int64_t e = 0; e < cfg.num_experts; ++e)
      for (const char* p : {"gate_proj", "up_proj", "down_proj"})
        for (const char* t : {"weight_packed", "weight_scale"}) {
          const std::string n = "model.layers." + std::to_string(layer) + ".mlp.experts." +
                                std::to_string(e) + "." + p + "." + t;
          const auto a = gv.at(n).bytes(), b = cv.at(n).bytes();
          ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << n;
        }
  // The formula on the stacked bytes themselves: up row i of expert 2 is stack row 2i + 1.
  const auto blocks = graw.at("model.layers.1.mlp.experts.gate_up_proj_blocks").bytes();
  const auto scales = graw.at("model.layers.1.mlp.experts.gate_up_proj_scales").bytes();
  reference::TensorMap tm;
  const std::string ep = "model.layers.1.mlp.experts.2.up_proj.";
  for (const char* t : {"weight_packed", "weight_scale"}) {
    const TensorRef& r = gv.at(ep + t);
    reference::HostTensor h;
    h.dtype = r.info->dtype;
    for (uint64_t d : r.info->shape)
      h.shape.push_back(static_cast<int64_t>(d));
    h.bytes.assign(r.bytes().begin(), r.bytes().end());
    tm[t] = std::move(h);
  }
  const Matrix w = reference::dequantize_mxfp4(tm, ep + "weight");
  static const double e2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const uint64_t I = static_cast<uint64_t>(cfg.moe_intermediate_size), G = H / 32;
  for (uint64_t i = 0; i < I; ++i)
    for (uint64_t k = 0; k < H; ++k) {
      const uint64_t row = 2 * 2 * I /*expert 2*/ + 2 * i + 1;
      const uint8_t byte = blocks[(row * G + k / 32) * 16 + (k % 32) / 2];
      const uint8_t code = k % 2 == 0 ? byte & 0xF : byte >> 4;
      const double v = (code & 8 ? -1.0 : 1.0) * e2m1[code & 7] *
                       std::ldexp(1.0, static_cast<int>(scales[row * G + k / 32]) - 127);
      ASSERT_EQ(w(static_cast<int64_t>(i), static_cast<int64_t>(k)), v) << i << " " << k;
    }
}

TEST(GptOssCheckpoint, ReaderRefusesBrokenStacksByName) {
  const ModelConfig cfg = load_model_config(gpt_oss_fixture() / "config.json");
  const fs::path d = test::scratch_dir("qparity_gpt_oss") / "broken";
  fs::create_directories(d);
  std::vector<uint8_t> b(4 * 256 * 4 * 16), s(4 * 256 * 4);
  auto open_with = [&](std::vector<TensorToWrite> t) {
    write_safetensors(d / "model.safetensors", std::move(t), std::nullopt,
                      OverwritePolicy::kReplace);
    return error_of([&] { gpt_oss_expert_view(Checkpoint::open(d / "model.safetensors"), cfg); });
  };
  const std::string st = "model.layers.0.mlp.experts.gate_up_proj";
  std::string msg = open_with({{st + "_blocks", DType::kU8, {4, 256, 4, 16}, b}});
  EXPECT_NE(msg.find("_scales"), std::string::npos) << msg;
  msg = open_with({{st + "_blocks", DType::kU8, {4, 256, 4, 16}, b},
                   {st + "_scales", DType::kU8, {4, 256, 4, 1}, s}});
  EXPECT_NE(msg.find("expected shape [4, 256, 4]"), std::string::npos) << msg;
  msg = open_with({{st, DType::kU8, {4, 256, 4, 16}, b}});
  EXPECT_NE(msg.find("float dtype"), std::string::npos) << msg;
}

// The reference runs both checkpoints; prefill logits equal token-by-token decode bit for bit
// (the sliding window and sinks applied alike), and MXFP4 experts move the logits but little.
TEST(GptOssCheckpoint, ReferenceRunsBf16AndMxfp4) {
  const std::vector<int64_t> tokens = {5, 77, 3, 401, 19, 250, 9, 64, 311, 2, 88, 17, 140, 7};
  Matrix bf16, mx;
  for (const fs::path& dir : {gpt_oss_fixture(), mxfp4_fixture("gpt-oss")}) {
    auto prefill = reference::load_model(dir);
    const Matrix full = prefill->forward(tokens);
    auto decode = reference::load_model(dir);
    for (size_t t = 0; t < tokens.size(); ++t) {
      const Matrix step = decode->forward(std::span<const int64_t>(&tokens[t], 1));
      for (int64_t c = 0; c < full.cols; ++c)
        ASSERT_NEAR(step(0, c), full(static_cast<int64_t>(t), c),
                    1e-12 * (1.0 + std::abs(full(static_cast<int64_t>(t), c))))
            << dir << " token " << t;
    }
    for (double v : full.data)
      ASSERT_TRUE(std::isfinite(v));
    (dir == gpt_oss_fixture() ? bf16 : mx) = full;
  }
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < bf16.data.size(); ++i) {
    num += (mx.data[i] - bf16.data[i]) * (mx.data[i] - bf16.data[i]);
    den += bf16.data[i] * bf16.data[i];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-6);  // the experts did change
  EXPECT_LT(rel, 0.3);
}

}  // namespace
}  // namespace qparity
