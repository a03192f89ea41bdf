// Leaving linears unquantized: the ignore list of quantize_checkpoint in both producer layouts
// (compressed-tensors quantization_config.ignore, msModelSlim "FLOAT"), read back by the
// reference's plan and loader; the shape rules a scheme breaks, found from config.json and the
// safetensors headers alone (scheme_exclusions); --ignore-unsupported on a real small Llama's
// shapes (hidden 64, intermediate 172); fp8-block with ragged 128x128 tiles end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/description/quant_plan.h"
#include "tests/unit/error_of.h"

namespace qparity::fixtures {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("qparity_test_ignore_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

// A tiny fixture; hidden / intermediate / moe_intermediate override the size's own.
fs::path fixture(const std::string& name, Arch arch, DType dtype, int64_t hidden = 0,
                 int64_t intermediate = 0, int64_t moe_intermediate = 0) {
  const fs::path dir = scratch(name);
  FixtureSpec spec{arch, FixtureSize::kTiny, 11, dtype};
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.moe_intermediate = moe_intermediate;
  write_fp_checkpoint(spec, dir, OverwritePolicy::kRefuse);
  return dir;
}

// The Llama of the issue: hidden 64, intermediate 172, fp32 weights.
fs::path odd_llama(const std::string& name) {
  return fixture(name, Arch::kLlama, DType::kF32, 64, 172);
}

std::vector<uint8_t> bytes_of(const Checkpoint& ck, const std::string& name) {
  const auto b = ck.at(name).bytes();
  return {b.begin(), b.end()};
}

std::vector<std::string> modules_of(const SchemeExclusions& x) {
  std::vector<std::string> m;
  for (const SchemeExclusion& e : x.modules)
    m.push_back(e.module);
  return m;
}

// Loads `dir` in the reference and runs a few tokens: every logit finite.
void expect_runs(const fs::path& dir, Dialect dialect = Dialect::kIdeal) {
  reference::LoadOptions lo;
  lo.dialect = dialect;
  auto model = reference::load_model(dir, lo);
  const std::vector<int64_t> tokens = {1, 7, 42, 3, 99};
  const Matrix logits = model->forward(tokens);
  ASSERT_EQ(logits.rows, 5);
  for (double v : logits.data)
    ASSERT_TRUE(std::isfinite(v)) << dir;
}

// ---------------------------------------------------------------------------------------------

TEST(SchemeExclusions, FromShapesOfAnOddLlama) {
  const fs::path in = odd_llama("excl_llama");
  // 2 layers x 7 linears; K = 64 everywhere but down_proj (K = 172).
  struct Case {
    const char* scheme;
    Dialect dialect;
    const char* rule;  // empty: nothing excluded
  };
  const Case cases[] = {
      {"w8a16-g64", Dialect::kMsModelSlim, "w8a16-g64 needs K = 172 divisible by 64"},
      {"w4a16-g32", Dialect::kCompressedTensors, "w4a16-g32 needs K = 172 divisible by 32"},
      // mxint4 is the expert-stack form; dense linears run w4a16-g32.
      {"mxint4", Dialect::kCompressedTensors, "w4a16-g32 needs K = 172 divisible by 32"},
      {"nvfp4", Dialect::kCompressedTensors, "nvfp4 needs K = 172 divisible by 16"},
      {"mxfp4", Dialect::kCompressedTensors, "mxfp4 needs K = 172 divisible by 32"},
      {"fp8-block", Dialect::kIdeal, ""},  // ragged tiles and activation groups
      {"fp8-channel", Dialect::kCompressedTensors, ""},
      {"bf16", Dialect::kCompressedTensors, ""},
      {"kv-int8", Dialect::kMsModelSlim, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheme);
    const SchemeExclusions x = scheme_exclusions(in, parse_scheme_id(c.scheme), c.dialect);
    const bool weights = std::string(c.scheme) != "bf16" && std::string(c.scheme) != "kv-int8";
    EXPECT_EQ(x.candidates, weights ? 14 : 0);
    if (std::string(c.rule).empty()) {
      EXPECT_TRUE(x.modules.empty()) << x.modules.front().rule;
      EXPECT_EQ(x.excluded, 0);
      continue;
    }
    EXPECT_THAT(modules_of(x),
                ElementsAre("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"));
    EXPECT_EQ(x.excluded, 2);
    EXPECT_FALSE(x.everything());
    const SchemeExclusion& e = x.modules.front();
    EXPECT_EQ(e.tensor, "model.layers.0.mlp.down_proj.weight");
    EXPECT_EQ(e.rule, c.rule);
    EXPECT_EQ(e.ignore_entry, "model.layers.0.mlp.down_proj");
  }
  // fp8-block under dialects whose 1x128 activation groups need K % 128: K = 64 and K = 172
  // both break it, so the scheme can take nothing; each rule names its source.
  for (const auto& [d, source] :
       {std::pair{Dialect::kCompressedTensors, "compute_dynamic_scales_and_zp"},
        std::pair{Dialect::kVllm, "per_token_group_quant_fp8"}}) {
    const SchemeExclusions x = scheme_exclusions(in, parse_scheme_id("fp8-block"), d);
    EXPECT_TRUE(x.everything()) << qparity::to_string(d);
    ASSERT_EQ(x.modules.size(), 14u);
    EXPECT_EQ(x.modules.front().module, "model.layers.0.self_attn.q_proj");
    EXPECT_EQ(x.modules.front().tensor, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_THAT(x.modules.front().rule, HasSubstr("needs K = 64 divisible by 128"));
    EXPECT_THAT(x.modules.front().rule, HasSubstr(source));
  }
  fs::remove_all(in);
}

TEST(SchemeExclusions, ExpertStackIsOneEntry) {
  // Qwen3-MoE: layer 0 sparse with moe_intermediate 172 (the stack's w2 has K = 172), layer 1
  // dense with intermediate 256.
  const fs::path in = fixture("excl_moe", Arch::kQwen3Moe, DType::kBF16, 0, 0, 172);
  const SchemeExclusions x =
      scheme_exclusions(in, parse_scheme_id("mxint4"), Dialect::kCompressedTensors);
  ASSERT_EQ(x.modules.size(), 1u);
  const SchemeExclusion& e = x.modules.front();
  EXPECT_EQ(e.module, "model.layers.0.mlp.experts");
  EXPECT_EQ(e.tensor, "model.layers.0.mlp.experts.0.down_proj.weight");
  EXPECT_EQ(e.rule, "mxint4 needs K = 172 divisible by 32");
  EXPECT_EQ(e.ignore_entry, "re:model\\.layers\\.0\\.mlp\\.experts\\.");
  // The whole stack (4 experts x gate/up/down) is out; layer 0's q/k/v/o and layer 1's 7
  // linears remain (the router is never quantized).
  EXPECT_EQ(x.candidates, 4 * 3 + 4 + 7);
  EXPECT_EQ(x.excluded, 12);
  // SGLang's block-fp8 MoE breaks on both w13 (I rows) and w2 (K = I): still one entry. (Its
  // fused q/k/v breaks too: k_proj's 64 rows are no multiple of 128.)
  const SchemeExclusions s = scheme_exclusions(in, parse_scheme_id("fp8-block"), Dialect::kSglang);
  const auto stacks = std::count_if(s.modules.begin(), s.modules.end(), [](const auto& m) {
    return m.module == "model.layers.0.mlp.experts";
  });
  EXPECT_EQ(stacks, 1);
  EXPECT_THAT(modules_of(s), ::testing::Contains("model.layers.0.self_attn.k_proj"));
  fs::remove_all(in);
}

TEST(SchemeExclusions, HeaderShapesMustMatchConfig) {
  const fs::path in = odd_llama("excl_header");
  Json cfg = read_json_file(in / "config.json");
  cfg["intermediate_size"] = 171;
  std::ofstream(in / "config.json") << json_file_text(cfg);
  const std::string e =
      error_of([&] { scheme_exclusions(in, parse_scheme_id("w4a16-g32"), Dialect::kIdeal); });
  EXPECT_THAT(e, HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight': header shape "
                           "[172, 64] is not [171, 64] from config.json"));
  fs::remove_all(in);
}

TEST(QuantizeIgnore, CompressedTensorsRoundTrip) {
  const fs::path in = fixture("ct_in", Arch::kLlama, DType::kBF16), out = scratch("ct_out");
  QuantizeCheckpointOptions o;
  o.ignore = {"model.layers.0.mlp.down_proj", "re:model\\.layers\\.1\\.self_attn\\.(q|k|v)_proj"};
  std::ostringstream log;
  quantize_checkpoint(in, parse_scheme_id("fp8-channel"), Dialect::kCompressedTensors, out, {},
                      OverwritePolicy::kRefuse, &log, o);
  EXPECT_THAT(log.str(), HasSubstr("layer 1/2: quantized 6 linears, ignored 1 (fp8-channel)"));
  EXPECT_THAT(log.str(), HasSubstr("layer 2/2: quantized 4 linears, ignored 3 (fp8-channel)"));
  const Json qc = read_json_file(out / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("ignore"), Json::array({"lm_head", "model.layers.0.mlp.down_proj",
                                          "re:model\\.layers\\.1\\.self_attn\\.(q|k|v)_proj"}));

  const Checkpoint fp = Checkpoint::open(in), q = Checkpoint::open(out);
  const std::vector<std::string> ignored = {
      "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
      "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"};
  for (const std::string& m : ignored) {
    EXPECT_EQ(q.at(m + ".weight").info->dtype, DType::kBF16) << m;
    EXPECT_EQ(bytes_of(q, m + ".weight"), bytes_of(fp, m + ".weight")) << m;
    EXPECT_FALSE(q.contains(m + ".weight_scale")) << m;
  }
  EXPECT_EQ(q.at("model.layers.1.mlp.down_proj.weight").info->dtype, DType::kF8E4M3);

  // The reference reads the ignore entries back: those modules run unquantized.
  const ModelConfig cfg = load_model_config(out / "config.json");
  const QuantPlan plan = build_quant_plan(cfg, out, std::nullopt);
  EXPECT_TRUE(plan.warnings().empty()) << plan.warnings().front();
  for (const std::string& m : ignored) {
    const PlanEntry& e = plan.method_for(m);
    EXPECT_FALSE(e.quantized()) << m;
    EXPECT_EQ(e.why.note, "ignored") << m;
  }
  EXPECT_EQ(plan.method_for("model.layers.0.mlp.down_proj").why.key,
            "quantization_config.ignore[1]");
  EXPECT_EQ(plan.method_for("model.layers.1.self_attn.k_proj").why.key,
            "quantization_config.ignore[2]");
  EXPECT_EQ(plan.method_for("model.layers.1.mlp.down_proj").scheme_string(), "fp8-channel");
  expect_runs(out);
  for (const auto& p : {in, out})
    fs::remove_all(p);
}

// A run that quantizes nothing is an error naming the scheme (main wrote a bf16 copy and said
// "wrote compressed-tensors checkpoint (fp8-block ...)", exit 0), and it leaves no output.
TEST(QuantizeIgnore, QuantizingNothingIsAnError) {
  const fs::path in = fixture("none_in", Arch::kLlama, DType::kBF16), out = scratch("none_out");
  QuantizeCheckpointOptions o;
  o.ignore = {"re:.*"};
  try {
    quantize_checkpoint(in, parse_scheme_id("fp8-channel"), Dialect::kCompressedTensors, out, {},
                        OverwritePolicy::kRefuse, nullptr, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheme fp8-channel quantizes no linear of this model"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out / "config.json"));
  fs::remove_all(in);
  fs::remove_all(out);
}

TEST(QuantizeIgnore, MsModelSlimRoundTrip) {
  const fs::path in = fixture("msm_in", Arch::kLlama, DType::kBF16), out = scratch("msm_out");
  QuantizeCheckpointOptions o;
  o.ignore = {"model.layers.1.mlp.down_proj"};
  quantize_checkpoint(in, parse_scheme_id("w8a16-g64"), Dialect::kMsModelSlim, out, {},
                      OverwritePolicy::kRefuse, nullptr, o);
  const Json desc = read_json_file(out / "quant_model_description.json");
  EXPECT_EQ(desc.at("model.layers.1.mlp.down_proj.weight"), "FLOAT");
  EXPECT_FALSE(desc.contains("model.layers.1.mlp.down_proj.weight_scale"));
  EXPECT_EQ(desc.at("model.layers.0.mlp.down_proj.weight"), "W8A16");
  EXPECT_EQ(desc.at("model_quant_type"), "W8A16");
  EXPECT_FALSE(read_json_file(out / "config.json").contains("quantization_config"));
  const Checkpoint fp = Checkpoint::open(in), q = Checkpoint::open(out);
  EXPECT_EQ(bytes_of(q, "model.layers.1.mlp.down_proj.weight"),
            bytes_of(fp, "model.layers.1.mlp.down_proj.weight"));
  const QuantPlan plan =
      build_quant_plan(load_model_config(out / "config.json"), out, std::nullopt);
  EXPECT_FALSE(plan.method_for("model.layers.1.mlp.down_proj").quantized());
  EXPECT_EQ(plan.method_for("model.layers.0.mlp.down_proj").scheme_string(), "w8a16-g64");
  expect_runs(out);
  for (const auto& p : {in, out})
    fs::remove_all(p);
}

TEST(QuantizeIgnore, EntriesMatchingNothingOrSplittingAFusedLayerAreErrors) {
  const fs::path in = fixture("err_in", Arch::kLlama, DType::kBF16), out = scratch("err_out");
  auto quantize = [&](std::vector<std::string> ignore) {
    QuantizeCheckpointOptions o;
    o.ignore = std::move(ignore);
    quantize_checkpoint(in, parse_scheme_id("fp8-channel"), Dialect::kCompressedTensors, out, {},
                        OverwritePolicy::kRefuse, nullptr, o);
  };
  // A typo must not silently quantize everything.
  EXPECT_THAT(error_of([&] {
                quantize({"model.layers.0.mlp.down_proj", "model.layers.0.mlp.dwn"});
              }),
              HasSubstr("--ignore 'model.layers.0.mlp.dwn': matches no linear of the model"));
  EXPECT_THAT(error_of([&] { quantize({"re:model\\.layer\\.0\\."}); }),
              HasSubstr("--ignore 're:model\\.layer\\.0\\.': matches no linear"));
  // A module that is not a linear (compressed-tensors matches names exactly).
  EXPECT_THAT(error_of([&] { quantize({"model.layers.0.mlp"}); }),
              HasSubstr("--ignore 'model.layers.0.mlp': matches no linear"));
  // q/k/v run fused with one scheme.
  EXPECT_THAT(error_of([&] { quantize({"model.layers.0.self_attn.k_proj"}); }),
              HasSubstr("model.layers.0.self_attn.q_proj: --ignore leaves this fused "
                        "model.layers.0.self_attn.qkv_proj partly quantized (ignored: "
                        "model.layers.0.self_attn.k_proj; quantized: "
                        "model.layers.0.self_attn.q_proj, model.layers.0.self_attn.v_proj)"));
  EXPECT_FALSE(fs::exists(out / "config.json"));
  // smoothquant rescales every consumer: nothing can be left out.
  EXPECT_THAT(error_of([&] {
                QuantizeCheckpointOptions o;
                o.ignore = {"model.layers.0.mlp.down_proj"};
                quantize_checkpoint(in, parse_scheme_id("smoothquant"), Dialect::kMsModelSlim, out,
                                    {}, OverwritePolicy::kRefuse, nullptr, o);
              }),
              HasSubstr("cannot leave a linear out"));
  fs::remove_all(in);
}

TEST(QuantizeIgnore, UnsupportedLinearsAreNamedOrIgnored) {
  const fs::path in = odd_llama("odd_in"), out = scratch("odd_out");
  const SchemeId w4 = parse_scheme_id("w4a16-g32");
  EXPECT_EQ(error_of([&] {
              quantize_checkpoint(in, w4, Dialect::kCompressedTensors, out, {},
                                  OverwritePolicy::kRefuse, nullptr);
            }),
            "model.layers.0.mlp.down_proj: w4a16-g32 needs K = 172 divisible by 32; leave it "
            "unquantized with --ignore model.layers.0.mlp.down_proj (or --ignore-unsupported for "
            "every such module)");
  // Ignoring one is not enough: the next one is named.
  QuantizeCheckpointOptions o;
  o.ignore = {"model.layers.0.mlp.down_proj"};
  EXPECT_THAT(error_of([&] {
                quantize_checkpoint(in, w4, Dialect::kCompressedTensors, out, {},
                                    OverwritePolicy::kRefuse, nullptr, o);
              }),
              HasSubstr("model.layers.1.mlp.down_proj: w4a16-g32 needs K = 172"));
  EXPECT_FALSE(fs::exists(out / "config.json"));

  o.ignore_unsupported = true;
  const IgnorePlan plan = plan_ignore(in, w4, Dialect::kCompressedTensors, o);
  EXPECT_THAT(plan.entries,
              ElementsAre("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"));
  ASSERT_EQ(plan.added.size(), 1u);  // layer 0's was given
  std::ostringstream log;
  quantize_checkpoint(in, w4, Dialect::kCompressedTensors, out, {}, OverwritePolicy::kRefuse, &log,
                      o);
  EXPECT_THAT(log.str(), HasSubstr("ignoring model.layers.1.mlp.down_proj (w4a16-g32 needs K = "
                                   "172 divisible by 32)"));
  const Json qc = read_json_file(out / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("ignore"), Json::array({"lm_head", "model.layers.0.mlp.down_proj",
                                          "model.layers.1.mlp.down_proj"}));
  const Checkpoint fp = Checkpoint::open(in), q = Checkpoint::open(out);
  for (const char* m : {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}) {
    EXPECT_EQ(q.at(std::string(m) + ".weight").info->dtype, DType::kF32);
    EXPECT_EQ(bytes_of(q, std::string(m) + ".weight"), bytes_of(fp, std::string(m) + ".weight"));
  }
  EXPECT_TRUE(q.contains("model.layers.0.mlp.up_proj.weight_packed"));
  expect_runs(out);

  // msModelSlim's layout: the same linears FLOAT, and the model runs.
  const fs::path msm = scratch("odd_msm");
  QuantizeCheckpointOptions all;
  all.ignore_unsupported = true;
  quantize_checkpoint(in, parse_scheme_id("w8a16-g64"), Dialect::kMsModelSlim, msm, {},
                      OverwritePolicy::kRefuse, nullptr, all);
  const Json desc = read_json_file(msm / "quant_model_description.json");
  EXPECT_EQ(desc.at("model.layers.0.mlp.down_proj.weight"), "FLOAT");
  EXPECT_EQ(desc.at("model.layers.0.mlp.up_proj.weight"), "W8A16");
  expect_runs(msm);
  for (const auto& p : {in, out, msm})
    fs::remove_all(p);
}

TEST(QuantizeIgnore, UnsupportedExpertStackIgnoredWhole) {
  const fs::path in = fixture("moe_in", Arch::kQwen3Moe, DType::kBF16, 0, 0, 172);
  const fs::path out = scratch("moe_out");
  QuantizeCheckpointOptions o;
  o.ignore_unsupported = true;
  quantize_checkpoint(in, parse_scheme_id("mxint4"), Dialect::kCompressedTensors, out, {},
                      OverwritePolicy::kRefuse, nullptr, o);
  const Json qc = read_json_file(out / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("ignore"),
            Json::array({"lm_head", "re:.*mlp.gate$", "re:model\\.layers\\.0\\.mlp\\.experts\\."}));
  const QuantPlan plan =
      build_quant_plan(load_model_config(out / "config.json"), out, std::nullopt);
  EXPECT_EQ(plan.method_for("model.layers.0.mlp.experts").scheme_string(), "bf16");
  EXPECT_EQ(plan.method_for("model.layers.1.mlp.down_proj").scheme_string(), "w4a16-g32");
  expect_runs(out);
  // Leaving one expert out alone is refused: engines fuse the stack.
  QuantizeCheckpointOptions one;
  one.ignore = {"model.layers.0.mlp.experts.2.down_proj"};
  EXPECT_THAT(error_of([&] {
                quantize_checkpoint(in, parse_scheme_id("fp8-channel"), Dialect::kCompressedTensors,
                                    scratch("moe_out2"), {}, OverwritePolicy::kRefuse, nullptr,
                                    one);
              }),
              HasSubstr("model.layers.0.mlp.experts: --ignore leaves this expert stack partly "
                        "quantized"));
  for (const auto& p : {in, out})
    fs::remove_all(p);
}

TEST(RaggedFp8Block, OddLlamaQuantizesLoadsAndRuns) {
  // No exclusions under ideal: N = 172 and K = 172 give ragged tiles, K = 64 one partial tile.
  const fs::path in = odd_llama("blk_in"), out = scratch("blk_out");
  quantize_checkpoint(in, parse_scheme_id("fp8-block"), Dialect::kIdeal, out, {},
                      OverwritePolicy::kRefuse, nullptr);
  const Checkpoint q = Checkpoint::open(out);
  EXPECT_EQ(q.at("model.layers.0.mlp.down_proj.weight_scale").info->shape,
            (std::vector<uint64_t>{1, 2}));  // [ceil(64/128), ceil(172/128)]
  EXPECT_EQ(q.at("model.layers.0.mlp.gate_proj.weight_scale").info->shape,
            (std::vector<uint64_t>{2, 1}));  // [ceil(172/128), ceil(64/128)]
  EXPECT_EQ(read_json_file(out / "config.json").at("quantization_config").at("ignore"),
            Json::array({"lm_head"}));
  expect_runs(out);
  // vLLM's group kernel refuses the same file, naming the tensor and the rule.
  EXPECT_THAT(error_of([&] { expect_runs(out, Dialect::kVllm); }),
              HasSubstr("model.layers.0.self_attn.q_proj.weight: fp8-block under the vllm "
                        "dialect quantizes activations in 1x128 groups and needs K = 64 "
                        "divisible by 128"));
  for (const auto& p : {in, out})
    fs::remove_all(p);
}

}  // namespace
}  // namespace qparity::fixtures
