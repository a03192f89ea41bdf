// `qparity quantize` and `qparity trace` end to end: a fixture is quantized with statistics from
// calibration tokens, traced as one prefill and as token-by-token decode (equal to 1e-12), with
// capture-point selection, and bad input ends in one error line naming the problem. `qparity
// trace-vision` runs a Qwen3-VL fixture's vision tower on a pixel file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../unit/quant_test_util.h"
#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/json_util.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "schemes/method/tensor_decode.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class CliTraceQuantize : public testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::test_seed();
    dir_ = fs::temp_directory_path() / ("qparity_tq_" + std::to_string(seed_));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  test::CliRun run(const std::string& args) { return test::run_cli(dir_, args); }
  std::string p(const std::string& leaf) const { return (dir_ / leaf).string(); }
  // px.st for the tiny qwen3-vl fixture's tower (patch 4, temporal 2, 3 channels: 96 values a
  // patch): `grids` (t, h, w per image) and a smooth pattern of `phase`.
  void write_pixels(const std::vector<int64_t>& grids, double phase) const {
    uint64_t n = 0;
    for (size_t i = 0; i < grids.size(); i += 3)
      n += static_cast<uint64_t>(grids[i] * grids[i + 1] * grids[i + 2]);
    std::vector<double> px(n * 96);
    for (size_t i = 0; i < px.size(); ++i)
      px[i] = std::sin(0.37 * static_cast<double>(i) + phase);
    auto bytes = [](const auto& v) {
      return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                      v.size() * sizeof(v[0]));
    };
    write_safetensors(dir_ / "px.st",
                      {{"pixel_values", DType::kF64, {n, 96}, bytes(px)},
                       {"image_grid_thw", DType::kI64, {grids.size() / 3, 3}, bytes(grids)}},
                      std::nullopt, OverwritePolicy::kRefuse);
  }

  uint64_t seed_ = 0;
  fs::path dir_;
};

TEST_F(CliTraceQuantize, QuantizeThenTracePrefillEqualsDecode) {
  const std::string s = std::to_string(seed_ % 1000);
  ASSERT_EQ(run("make-fixture --arch llama --seed " + s + " --out " + p("fp")).status, 0);
  std::ofstream(dir_ / "calib.txt") << "1, 2, 3, 4\n5 6 7 8 9 10 11 12\n";
  auto r = run("quantize --in " + p("fp") + " --scheme w8a8-static --calib " + p("calib.txt") +
               " --out " + p("q"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("calibrating on 12 tokens"));
  EXPECT_TRUE(fs::exists(dir_ / "q" / "quant_model_description.json"));
  ASSERT_EQ(
      run("trace --model " + p("q") + " --token-ids 5,17,3,99,42,7 --out " + p("a.st")).status, 0);
  r = run("trace --model " + p("q") +
          " --token-ids 5,17,3,99,42,7 --decode --capture "
          "'logits,layers.*.residual' --out " +
          p("b.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto b = SafetensorsFile::open(dir_ / "b.st");
  EXPECT_TRUE(b.find("layers.1.residual"));
  EXPECT_FALSE(b.find("layers.0.attn.core")) << "--capture selects points";
  EXPECT_EQ(b.metadata().at("steps"), "decode");
  for (const char* point : {"logits", "layers.0.residual", "layers.1.residual"})
    EXPECT_LE(test::relative_l2(test::read_matrix(dir_ / "b.st", point),
                                test::read_matrix(dir_ / "a.st", point)),
              1e-12)
        << point;
}

TEST_F(CliTraceQuantize, BadInputEndsInOneLine) {
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed 1 --out " + p("fp")).status, 0);
  auto r = run("trace --model " + p("fp") + " --token-ids 1,100000 --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("token id 100000 is outside the model's vocabulary"));
  r = run("trace --model " + p("fp") + " --token-ids 1,x --out " + p("x.st"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("'x' is not a token id"));
  // Usage errors (conflicting options, a value outside an option's choices) exit 2.
  r = run("trace --model " + p("fp") + " --token-ids 1 --synthetic 3 --out " + p("x.st"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("exactly one of"));
  r = run("trace --model " + p("fp") + " --token-ids 1 --mode fast --out " + p("x.st"));
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--mode"));
  // A token file, or standard input with '-'.
  std::ofstream(dir_ / "ids.txt") << "1 2\n3, 4\n";
  r = run("trace --model " + p("fp") + " --tokens " + p("ids.txt") + " --out " + p("f.st"));
  EXPECT_EQ(r.status, 0) << r.err;
  r = run("trace --model " + p("fp") + " --tokens - --out " + p("s.st") + " < " + p("ids.txt"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::read_matrix(dir_ / "f.st", "logits").data,
            test::read_matrix(dir_ / "s.st", "logits").data);
  std::ofstream(dir_ / "bad.txt") << "1 2 -3\n";
  r = run("quantize --in " + p("fp") + " --scheme fp8-tensor --calib " + p("bad.txt") + " --out " +
          p("q"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("'-3' is not a token id"));
  r = run("quantize --in " + p("nowhere") + " --scheme fp8-tensor --out " + p("q"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("nowhere"));
}

// A real small Llama's shapes (hidden 64, intermediate 172): K = 172 breaks w4a16-g32's K % 32.
// quantize names the linear and the way out before calibrating; --ignore / --ignore-unsupported
// leave those linears in fp32 and the result traces.
TEST_F(CliTraceQuantize, IgnoreListAndUnsupportedLinears) {
  ASSERT_EQ(
      run("make-fixture --arch llama --hidden 64 --intermediate 172 --seed 3 --out " + p("fp"))
          .status,
      0);
  const std::string base = "quantize --in " + p("fp") + " --scheme w4a16-g32 --out " + p("q");
  auto r = run(base);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("qparity: error: model.layers.0.mlp.down_proj: w4a16-g32 needs "
                               "K = 172 divisible by 32; leave it unquantized with --ignore "
                               "model.layers.0.mlp.down_proj"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("calibrating"))) << "checked before calibration";
  r = run(base + " --ignore model.layers.0.mlp.down_prj");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--ignore 'model.layers.0.mlp.down_prj': matches no linear"));

  r = run(base +
          " --ignore model.layers.0.mlp.down_proj --ignore 're:model\\.layers\\.1\\.mlp\\.down'");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string ct = test::slurp(dir_ / "q" / "config.json");
  EXPECT_THAT(ct, HasSubstr("\"model.layers.0.mlp.down_proj\""));
  EXPECT_THAT(ct, HasSubstr("\"re:model\\\\.layers\\\\.1\\\\.mlp\\\\.down\""));

  r = run("quantize --in " + p("fp") + " --scheme w8a16-g64 --ignore-unsupported --out " + p("m"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("quantize: ignoring model.layers.1.mlp.down_proj (w8a16-g64 needs "
                               "K = 172 divisible by 64)"));
  EXPECT_THAT(test::slurp(dir_ / "m" / "quant_model_description.json"),
              HasSubstr("\"model.layers.1.mlp.down_proj.weight\": \"FLOAT\""));
  for (const char* q : {"q", "m"}) {
    r = run("trace --model " + p(q) + " --synthetic 3 --out " + p(std::string(q) + ".st"));
    EXPECT_EQ(r.status, 0) << q << ": " << r.err;
  }
}

// --config: a published-style quantization_config (compressed-tensors' W4A16 recipe with a
// regex ignore) is written as the point it names, its ignored linears left unquantized, and the
// output plans as the config did; the same point by --scheme gives the same tensors. Configs
// quantize writes no single checkpoint for are refused naming why, before anything is read.
TEST_F(CliTraceQuantize, QuantizeFromAQuantizationConfig) {
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed 5 --out " + p("fp")).status, 0);
  const auto write = [&](const std::string& leaf, const std::string& text) {
    std::ofstream(dir_ / leaf) << text;
    return p(leaf);
  };
  const std::string w4 = write("w4.json", R"({"quantization_config": {
      "quant_method": "compressed-tensors", "format": "pack-quantized",
      "quantization_status": "compressed", "ignore": ["lm_head", "re:.*layers\\.1\\.mlp\\.down"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4,
        "type": "int", "symmetric": true, "strategy": "group", "group_size": 128,
        "actorder": null, "observer": "minmax"}, "input_activations": null,
        "output_activations": null}}}})");
  auto r = run("quantize --in " + p("fp") + " --config " + w4 + " --out " + p("qc"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("asks for ct-w4a16-g128 (1 linears left unquantized)"));
  r = run("inspect " + p("qc"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("summary: bf16 x2 ct-w4a16-g128 x13"));
  // The same point and ignore list by --scheme: the same tensors, byte for byte.
  r = run("quantize --in " + p("fp") + " --scheme W4A16 --ignore model.layers.1.mlp.down_proj" +
          " --out " + p("qs"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::slurp(dir_ / "qc" / "model.safetensors"),
            test::slurp(dir_ / "qs" / "model.safetensors"));

  // Two weight points: refused naming both.
  const std::string mixed = write("mixed.json", R"({"quant_method": "compressed-tensors",
      "format": "mixed-precision", "ignore": ["lm_head"], "config_groups": {
      "attn": {"targets": ["re:.*self_attn.*"], "format": "pack-quantized", "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}},
      "mlp": {"targets": ["re:.*mlp.*"], "format": "float-quantized", "weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}})");
  r = run("quantize --in " + p("fp") + " --config " + mixed + " --out " + p("qmix"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("w4a16-g32 (group attn, 8 linears)"));
  EXPECT_THAT(r.err, HasSubstr("fp8-channel (group mlp, 6 linears)"));
  r = run("inspect " + p("qmix"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("fp8-channel x6"), HasSubstr("w4a16-g32 x8")));
  {
    const Json qc = Json::parse(test::slurp(dir_ / "qmix" / "config.json"))["quantization_config"];
    EXPECT_EQ(qc["format"], "mixed-precision");
    EXPECT_EQ(qc["config_groups"]["attn"]["targets"], Json::array({"re:.*self_attn.*"}));
    EXPECT_EQ(qc["config_groups"]["attn"]["format"], "pack-quantized");
    EXPECT_EQ(qc["config_groups"]["mlp"]["format"], "float-quantized");
    EXPECT_EQ(qc["config_groups"]["mlp"]["input_activations"]["strategy"], "token");
  }
  r = run("trace --model " + p("qmix") + " --synthetic 3 --out " + p("qmix.st"));
  EXPECT_EQ(r.status, 0) << r.err;
  // A shape rule of one group's scheme is checked on that group's linears only: group-256
  // weights on the attention (K = 128 here) are refused naming an attention linear.
  const std::string mixed128 = write("mixed128.json", R"({"quant_method": "compressed-tensors",
      "format": "mixed-precision", "ignore": ["lm_head"], "config_groups": {
      "attn": {"targets": ["re:.*self_attn.*"], "format": "pack-quantized", "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 256}},
      "mlp": {"targets": ["re:.*mlp.*"], "format": "float-quantized", "weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}})");
  r = run("quantize --in " + p("fp") + " --config " + mixed128 + " --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("self_attn"), HasSubstr("256")));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("calibrating")));
  EXPECT_FALSE(fs::exists(dir_ / "qm"));
  // A mixed config as an attacker would give it: a target that is not a string, and a duplicate
  // group name (the later group would silently win); each refused naming the key, nothing written.
  const std::string badtarget = write("badtarget.json", R"({"quant_method": "compressed-tensors",
      "format": "mixed-precision", "ignore": ["lm_head"], "config_groups": {
      "attn": {"targets": ["re:.*self_attn.*", 7], "weights": {"num_bits": 4, "type": "int",
        "strategy": "group", "group_size": 32}},
      "mlp": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "channel"}, "input_activations": {"num_bits": 8, "type": "float",
        "strategy": "token", "dynamic": true}}}})");
  r = run("quantize --in " + p("fp") + " --config " + badtarget + " --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("config_groups.attn': key 'targets'[1]"),
                           HasSubstr("expected a string")));
  EXPECT_FALSE(fs::exists(dir_ / "qm"));
  const std::string dupgroup = write("dupgroup.json", R"({"quant_method": "compressed-tensors",
      "format": "mixed-precision", "ignore": ["lm_head"], "config_groups": {
      "g": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 4, "type": "int",
        "strategy": "group", "group_size": 32}},
      "g": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 8, "type": "float",
        "strategy": "channel"}}}})");
  r = run("quantize --in " + p("fp") + " --config " + dupgroup + " --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("duplicate key 'g'"));
  EXPECT_FALSE(fs::exists(dir_ / "qm"));
  // FP8 weights with an FP8 KV cache in one config (as RedHatAI's *-FP8-KV checkpoints publish
  // it: per-tensor weights and static inputs, kv_cache_scheme per tensor): both written, planned
  // back as both, and the same bytes as --scheme with --kv-cache; the per-head cache likewise.
  const std::string fp8kv = write("fp8kv.json", R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {"group_0": {
      "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
        "symmetric": true, "dynamic": false}, "input_activations": {"num_bits": 8,
        "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}}},
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
        "symmetric": true, "dynamic": false}})");
  r = run("quantize --in " + p("fp") + " --config " + fp8kv + " --out " + p("qkv"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("asks for fp8-tensor and a kv-fp8 KV cache"));
  r = run("inspect " + p("qkv"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("kv-fp8"));
  EXPECT_THAT(r.out, HasSubstr("fp8-tensor"));
  EXPECT_THAT(test::slurp(dir_ / "qkv" / "config.json"), HasSubstr("\"kv_cache_scheme\": {"));
  r = run("quantize --in " + p("fp") + " --scheme fp8-tensor --kv-cache kv-fp8 --out " + p("qkv2"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::slurp(dir_ / "qkv" / "model.safetensors"),
            test::slurp(dir_ / "qkv2" / "model.safetensors"));
  r = run("trace --model " + p("qkv") + " --synthetic 3 --out " + p("qkv.st"));
  EXPECT_EQ(r.status, 0) << r.err;
  r = run("quantize --in " + p("fp") + " --scheme fp8-channel --kv-cache kv-fp8-head --out " +
          p("qkvh"));
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("inspect " + p("qkvh"));
  EXPECT_THAT(r.out, HasSubstr("kv-fp8-head"));
  EXPECT_THAT(r.out, HasSubstr("fp8-channel"));
  // A cache beside what is not a compressed-tensors weight scheme: refused naming both.
  r = run("quantize --in " + p("fp") + " --scheme w8a16-ch --kv-cache kv-fp8 --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("kv cache 'kv-fp8'"), HasSubstr("w8a16-ch is not one")));
  EXPECT_FALSE(fs::exists(dir_ / "qm"));
  // FP8 weights with unquantized inputs (FP8 W8A16): the point fp8-channel-a16, written with no
  // input scales and planned back as itself.
  const std::string fp8a16 = write("fp8a16.json", R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}})");
  r = run("quantize --in " + p("fp") + " --config " + fp8a16 + " --out " + p("qa16"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("asks for fp8-channel-a16"));
  r = run("inspect " + p("qa16"));
  EXPECT_THAT(r.out, HasSubstr("fp8-channel-a16"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("input_scale")));
  // A sparsity_config beside the quantization: written when it covers exactly the quantized
  // linears, refused naming a linear when not.
  const std::string sparse = write("sparse.json", R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {
      "FP8_DYNAMIC": ["Linear"]}, "sparsity_config": {"format": "sparse-24-bitmask",
      "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": ["lm_head"]}})");
  r = run("quantize --in " + p("fp") + " --config " + sparse + " --out " + p("qsparse"));
  EXPECT_EQ(r.status, 0) << r.err;
  r = run("inspect " + p("qsparse"));
  EXPECT_THAT(r.out, HasSubstr("sparsity=sparse-24-bitmask"));
  EXPECT_THAT(r.out, HasSubstr("down_proj.bitmask"));
  const std::string partial = write("partial.json", R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {
      "FP8_DYNAMIC": ["Linear"]}, "sparsity_config": {"format": "sparse-24-bitmask",
      "sparsity_structure": "2:4", "targets": ["re:.*mlp.*"]}})");
  r = run("quantize --in " + p("fp") + " --config " + partial + " --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("is quantized but not sparse, or sparse but not quantized"));
  EXPECT_FALSE(fs::exists(dir_ / "qm"));
  // Args no id writes: per-tensor FP8 weights with dynamic per-token inputs (read as
  // fp8-tensor's method, whose id implies static per-tensor inputs): refused, not written.
  const std::string odd = write("odd.json", R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {"g": {
      "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                            "dynamic": true}}}})");
  r = run("quantize --in " + p("fp") + " --config " + odd + " --out " + p("qm"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("no scheme id names this point yet"));
  // The config file as an attacker would give it: a FIFO (never waited on), a duplicate key (the
  // later value would silently win), an empty file; each one error line, nothing written.
  ASSERT_EQ(mkfifo((dir_ / "fifo.json").c_str(), 0600), 0);
  write("dup.json", R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "format": "dense", "config_groups": {"W4A16": ["Linear"]}})");
  write("empty.json", "");
  for (const auto& [leaf, want] :
       std::vector<std::pair<std::string, std::string>>{{"fifo.json", "is not a regular file"},
                                                        {"dup.json", "duplicate key 'format'"},
                                                        {"empty.json", "invalid JSON"}}) {
    r = run("quantize --in " + p("fp") + " --config " + p(leaf) + " --out " + p("qa"));
    EXPECT_EQ(r.status, 1) << leaf;
    EXPECT_THAT(r.err, HasSubstr(want)) << leaf;
    EXPECT_FALSE(fs::exists(dir_ / "qa")) << leaf;
  }
  // --scheme and --config together, or neither: usage errors.
  EXPECT_EQ(run("quantize --in " + p("fp") + " --config " + w4 + " --scheme W4A16 --out " + p("qx"))
                .status,
            2);
  EXPECT_EQ(run("quantize --in " + p("fp") + " --out " + p("qx")).status, 2);
}

// GPTQ (v1 and v2) and AutoAWQ layouts written by quantize --format, planned back by their own
// readers (inspect names the producer's rules) and run by the reference: v1 and v2 of the same
// codes trace identically; a GPTQ config given to --config implies its layout.
TEST_F(CliTraceQuantize, QuantizeInGptqAndAwqLayouts) {
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed 5 --out " + p("fp")).status, 0);
  const std::string ign = " --ignore model.layers.1.mlp.down_proj";
  auto r =
      run("quantize --in " + p("fp") + " --scheme W4A16 --format gptq" + ign + " --out " + p("g1"));
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("inspect " + p("g1"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("source: gptq"));
  EXPECT_THAT(r.out, HasSubstr("rule: GPTQ checkpoint_format gptq (v1)"));
  EXPECT_THAT(r.out, HasSubstr("format=gptq"));
  EXPECT_THAT(r.out, HasSubstr("summary: bf16 x2 ct-w4a16-g128 x13"));
  EXPECT_THAT(r.out, HasSubstr("q_proj.qweight"));
  const Json qc = read_json_file(dir_ / "g1" / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("dynamic").begin().key(), "-:^model\\.layers\\.1\\.mlp\\.down_proj$");
  r = run("quantize --in " + p("fp") + " --scheme W4A16 --format gptq_v2" + ign + " --out " +
          p("g2"));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* d : {"g1", "g2"})
    ASSERT_EQ(run(std::string("trace --model ") + p(d) + " --token-ids 5,17,3,99 --out " +
                  p(std::string(d) + ".st"))
                  .status,
              0)
        << d;
  EXPECT_EQ(test::read_matrix(dir_ / "g1.st", "logits").data,
            test::read_matrix(dir_ / "g2.st", "logits").data);
  // AWQ: int4 with zero points only.
  r = run("quantize --in " + p("fp") + " --scheme W4A16_ASYM --format awq" + ign + " --out " +
          p("aw"));
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("inspect " + p("aw"));
  EXPECT_THAT(r.out, HasSubstr("source: awq"));
  EXPECT_THAT(r.out, HasSubstr("ct-w4a16-g128-asym"));
  EXPECT_EQ(read_json_file(dir_ / "aw" / "config.json")
                .at("quantization_config")
                .at("modules_to_not_convert"),
            Json::array({"model.layers.1.mlp.down_proj"}));
  ASSERT_EQ(run("trace --model " + p("aw") + " --token-ids 5,17,3,99 --out " + p("aw.st")).status,
            0);
  r = run("quantize --in " + p("fp") + " --scheme W4A16 --format awq --out " + p("bad"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("stores int4 with zero points"));
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
  // A GPTQ quantization_config: its point, in its layout.
  std::ofstream(dir_ / "gptq.json") << R"({"bits": 8, "group_size": -1, "desc_act": false,
      "sym": true, "quant_method": "gptq", "checkpoint_format": "gptq_v2"})";
  r = run("quantize --in " + p("fp") + " --config " + p("gptq.json") + " --out " + p("g8"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("asks for ct-w8a16-ch"));
  r = run("inspect " + p("g8"));
  EXPECT_THAT(r.out, HasSubstr("format=gptq_v2"));
  EXPECT_THAT(r.out, HasSubstr("ct-w8a16-ch"));
}

// ModelOpt's spelling of the same numbers: a compressed-tensors fp8-tensor (and a kv-fp8)
// checkpoint rewritten as ModelOpt exports it (hf_quant_config.json beside a config.json without
// quantization_config, 0-dim F32 weight_scale / input_scale, <attn>.k_proj.k_scale and
// v_proj.v_scale) plans as ModelOpt and traces bit for bit as the original.
TEST_F(CliTraceQuantize, ModelOptSpellingTracesAsTheCompressedTensorsOne) {
  ASSERT_EQ(run("make-fixture --arch llama --seed 5 --out " + p("fp")).status, 0);
  for (const std::string scheme : {"fp8-tensor", "kv-fp8"}) {
    SCOPED_TRACE(scheme);
    const fs::path ct = dir_ / ("ct-" + scheme), mo = dir_ / ("mo-" + scheme);
    auto r = run("quantize --in " + p("fp") + " --scheme " + scheme +
                 " --calib-synthetic 64 --out " + ct.string());
    ASSERT_EQ(r.status, 0) << r.err;
    fs::create_directories(mo);
    Json cfg = read_json_file(ct / "config.json");
    cfg.erase("quantization_config");
    std::ofstream(mo / "config.json") << cfg.dump(2);
    const bool kv = scheme == "kv-fp8";
    const Json hf = {{"producer", {{"name", "modelopt"}, {"version", "0.23.0"}}},
                     {"quantization",
                      {{"quant_algo", kv ? Json(nullptr) : Json("FP8")},
                       {"kv_cache_quant_algo", kv ? Json("FP8") : Json(nullptr)},
                       {"exclude_modules", Json::array({"lm_head"})}}}};
    std::ofstream(mo / "hf_quant_config.json") << hf.dump(2);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      if (fs::exists(ct / f)) fs::copy_file(ct / f, mo / f);
    const auto file = SafetensorsFile::open(ct / "model.safetensors");
    std::vector<TensorToWrite> out;
    std::vector<std::vector<uint8_t>> owned;
    owned.reserve(file.tensors().size());
    for (const TensorInfo& t : file.tensors()) {
      std::string name = t.name;
      const auto ends = [&](const std::string& x) { return name.ends_with(x); };
      if (ends("self_attn.k_scale")) name.replace(name.size() - 7, 7, "k_proj.k_scale");
      if (ends("self_attn.v_scale")) name.replace(name.size() - 7, 7, "v_proj.v_scale");
      if (ends(".weight_scale") || ends(".input_scale") || ends(".k_scale") || ends(".v_scale")) {
        const double v = reference::decode_all(t.dtype, file.bytes(t), t.numel(), t.name).at(0);
        const float f = static_cast<float>(v);
        ASSERT_EQ(static_cast<double>(f), v) << t.name << " is exact in F32";
        owned.emplace_back(sizeof f);
        std::memcpy(owned.back().data(), &f, sizeof f);
        out.push_back({name, DType::kF32, {}, owned.back()});
      } else {
        out.push_back({name, t.dtype, t.shape, file.bytes(t)});
      }
    }
    write_safetensors(mo / "model.safetensors", out,
                      std::map<std::string, std::string>{{"format", "pt"}});
    r = run("inspect " + mo.string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("source: modelopt"));
    EXPECT_THAT(r.out, HasSubstr(kv ? "kv-fp8" : "fp8-tensor"));
    for (const fs::path& d : {ct, mo})
      ASSERT_EQ(run("trace --model " + d.string() + " --token-ids 5,17,3,99,42 --out " +
                    (d.string() + ".st"))
                    .status,
                0)
          << d;
    EXPECT_EQ(test::read_matrix(ct.string() + ".st", "logits").data,
              test::read_matrix(mo.string() + ".st", "logits").data);
    // quantize --format modelopt writes that spelling itself (F32 scales, fl32(amax / 448)).
    const fs::path w = dir_ / ("w-" + scheme);
    r = run("quantize --in " + p("fp") + " --scheme " + scheme +
            " --calib-synthetic 64 --format modelopt --out " + w.string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::exists(w / "hf_quant_config.json"));
    EXPECT_FALSE(read_json_file(w / "config.json").contains("quantization_config"));
    const auto wf = SafetensorsFile::open(w / "model.safetensors");
    const std::string scale =
        kv ? "model.layers.0.self_attn.k_proj.k_scale" : "model.layers.0.mlp.up_proj.weight_scale";
    ASSERT_NE(wf.find(scale), nullptr) << scale;
    EXPECT_EQ(wf.at(scale).dtype, DType::kF32);
    EXPECT_TRUE(wf.at(scale).shape.empty());
    r = run("inspect " + w.string());
    EXPECT_THAT(r.out, HasSubstr("source: modelopt"));
    ASSERT_EQ(run("trace --model " + w.string() + " --token-ids 5,17,3,99,42 --out " +
                  (w.string() + ".st"))
                  .status,
              0);
  }
  // FP8_PER_CHANNEL_PER_TOKEN: fp8-channel, weight_scale [N].
  auto r =
      run("quantize --in " + p("fp") + " --scheme fp8-channel --format modelopt --out " + p("pc"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(
      read_json_file(dir_ / "pc" / "hf_quant_config.json").at("quantization").at("quant_algo"),
      "FP8_PER_CHANNEL_PER_TOKEN");
  EXPECT_EQ(SafetensorsFile::open(dir_ / "pc" / "model.safetensors")
                .at("model.layers.0.mlp.up_proj.weight_scale")
                .shape.size(),
            1u);
  r = run("inspect " + p("pc"));
  EXPECT_THAT(r.out, HasSubstr("fp8-channel"));
  ASSERT_EQ(run("trace --model " + p("pc") + " --token-ids 5,17,3 --out " + p("pc.st")).status, 0);
  // NVFP4 as ModelOpt exports it: weight / weight_scale / weight_scale_2 / input_scale.
  r = run("quantize --in " + p("fp") +
          " --scheme nvfp4 --calib-synthetic 64 --format modelopt --out " + p("nv"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(
      read_json_file(dir_ / "nv" / "hf_quant_config.json").at("quantization").at("quant_algo"),
      "NVFP4");
  const auto nv = SafetensorsFile::open(dir_ / "nv" / "model.safetensors");
  EXPECT_EQ(nv.at("model.layers.0.mlp.up_proj.weight").dtype, DType::kU8);
  EXPECT_TRUE(nv.at("model.layers.0.mlp.up_proj.weight_scale_2").shape.empty());
  // ModelOpt shares weight_scale_2 across the fused gate / up (preprocess_linear_fusion).
  EXPECT_EQ(
      reference::decode_all(DType::kF32,
                            nv.bytes(nv.at("model.layers.0.mlp.up_proj.weight_scale_2")), 1, "up"),
      reference::decode_all(
          DType::kF32, nv.bytes(nv.at("model.layers.0.mlp.gate_proj.weight_scale_2")), 1, "gate"));
  r = run("inspect " + p("nv"));
  EXPECT_THAT(r.out, HasSubstr("nvfp4"));
  EXPECT_THAT(r.out, HasSubstr("format=modelopt"));
  ASSERT_EQ(run("trace --model " + p("nv") + " --token-ids 5,17,3 --out " + p("nv.st")).status, 0);
  // FP8_PB_WO: F32 tile scales [N/128, 1, K/128, 1]; MXFP8: the compressed-tensors tensors
  // under ModelOpt's config, so the same logits bit for bit.
  for (const auto& [scheme, algo] :
       {std::pair<std::string, std::string>{"fp8-block-a16", "FP8_PB_WO"}, {"mxfp8", "MXFP8"}}) {
    const std::string mo = "mo-" + scheme, ct = "ct-" + scheme;
    r = run("quantize --in " + p("fp") + " --scheme " + scheme + " --format modelopt --out " +
            p(mo));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(
        read_json_file(dir_ / mo / "hf_quant_config.json").at("quantization").at("quant_algo"),
        algo);
    const auto f = SafetensorsFile::open(dir_ / mo / "model.safetensors");
    const TensorInfo& sc = f.at("model.layers.0.mlp.up_proj.weight_scale");
    if (scheme == "mxfp8")
      EXPECT_EQ(sc.dtype, DType::kU8);
    else
      EXPECT_EQ(sc.shape.size(), 4u);
    r = run("inspect " + p(mo));
    EXPECT_THAT(r.out, AllOf(HasSubstr(" " + scheme + " "), HasSubstr("format=modelopt"),
                             HasSubstr("quant_algo " + algo)));
    ASSERT_EQ(run("trace --model " + p(mo) + " --token-ids 5,17,3 --out " + p(mo + ".st")).status,
              0);
    if (scheme != "mxfp8") continue;
    ASSERT_EQ(run("quantize --in " + p("fp") + " --scheme mxfp8 --out " + p(ct)).status, 0);
    ASSERT_EQ(run("trace --model " + p(ct) + " --token-ids 5,17,3 --out " + p(ct + ".st")).status,
              0);
    EXPECT_EQ(test::read_matrix(p(ct + ".st"), "logits").data,
              test::read_matrix(p(mo + ".st"), "logits").data);
  }
  r = run("quantize --in " + p("fp") + " --scheme mxfp4 --format modelopt --out " + p("x"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("is not a ModelOpt point"));
}

// quant_method fp8 as DeepSeek-V3 / Qwen3-FP8 publish it, written by --format hf-fp8 (or implied
// by a published config given to --config) and planned back by the fp8 reader.
TEST_F(CliTraceQuantize, QuantizeInTheHfFp8Layout) {
  ASSERT_EQ(run("make-fixture --arch qwen3-moe --seed 5 --out " + p("fp")).status, 0);
  auto r = run("quantize --in " + p("fp") +
               " --scheme fp8-block --format hf-fp8 --ignore-unsupported --out " + p("hb"));
  ASSERT_EQ(r.status, 0) << r.err;
  const Json qc = read_json_file(dir_ / "hb" / "config.json").at("quantization_config");
  EXPECT_EQ(qc.at("quant_method"), "fp8");
  EXPECT_EQ(qc.at("weight_block_size"), Json::array({128, 128}));
  EXPECT_EQ(qc.at("modules_to_not_convert")[1], "model.layers.0.mlp.gate");
  r = run("inspect " + p("hb"));
  EXPECT_THAT(r.out, HasSubstr("source: fp8"));
  EXPECT_THAT(r.out, HasSubstr("format=fp8"));
  EXPECT_THAT(r.out, HasSubstr("weight_scale_inv"));
  ASSERT_EQ(run("trace --model " + p("hb") + " --token-ids 5,17,3,99 --out " + p("hb.st")).status,
            0);
  // DeepSeek-V3's published block (tests/data/ct_configs/23-...): its point, in its layout.
  r = run(
      "quantize --in " + p("fp") + " --config " +
      (fs::path(QPARITY_SOURCE_DIR) / "tests/data/ct_configs/23-hf-fp8-deepseek-v3-block128.json")
          .string() +
      " --ignore-unsupported --out " + p("ds"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(
      read_json_file(dir_ / "ds" / "config.json").at("quantization_config").at("quant_method"),
      "fp8");
  r = run("quantize --in " + p("fp") + " --scheme fp8-channel --format hf-fp8 --out " + p("x"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("is not a quant_method fp8 point"));
}

TEST_F(CliTraceQuantize, TraceVisionWritesTheTowersPoints) {
  const std::string s = std::to_string(seed_ % 1000);
  ASSERT_EQ(run("make-fixture --arch qwen3-vl --seed " + s + " --out " + p("vl")).status, 0);
  write_pixels({1, 4, 4, 2, 2, 4}, static_cast<double>(seed_ % 7));
  auto r =
      run("trace-vision --model " + p("vl") + " --pixels " + p("px.st") + " --out " + p("v.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("32 patches in 2 image(s), 5 capture points"));
  EXPECT_EQ(test::read_matrix(dir_ / "v.st", "visual.merger").rows, 8);
  EXPECT_EQ(test::read_matrix(dir_ / "v.st", "visual.blocks.1.out").rows, 32);

  r = run("trace-vision --model " + p("vl") + " --pixels " + p("px.st") +
          " --capture 'visual.merger' --out " + p("v.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("exists"));
  // A pixel file without grids; a text-only architecture.
  const std::vector<double> px(16 * 96, 0.5);
  write_safetensors(dir_ / "nogrid.st",
                    {{"pixel_values",
                      DType::kF64,
                      {16, 96},
                      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(px.data()),
                                               px.size() * sizeof(double))}},
                    std::nullopt, OverwritePolicy::kRefuse);
  r = run("trace-vision --model " + p("vl") + " --pixels " + p("nogrid.st") + " --out " +
          p("w.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("image_grid_thw"));
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed " + s + " --out " + p("q3")).status, 0);
  r = run("trace-vision --model " + p("q3") + " --pixels " + p("px.st") + " --out " + p("w.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("Qwen3ForCausalLM has no vision tower the reference runs"));
}

TEST_F(CliTraceQuantize, TraceWithPixelsRunsTheImagePrompt) {
  const std::string s = std::to_string(seed_ % 1000);
  ASSERT_EQ(run("make-fixture --arch qwen3-vl --seed " + s + " --out " + p("vl")).status, 0);
  // Two images (4 x 4 and 4 x 6 patches: 4 and 6 placeholders); the tiny fixture's vocabulary
  // is 512 with image 510, vision_start 508, vision_end 509.
  write_pixels({1, 4, 4, 1, 4, 6}, static_cast<double>(seed_ % 5));
  const std::string ids = "3,14,508,510,510,510,510,509,92,508,510,510,510,510,510,510,509,7,8,9";
  const std::string common =
      "trace --model " + p("vl") + " --pixels " + p("px.st") + " --token-ids " + ids + " ";
  auto r = run(common + "--out " + p("pre.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::read_matrix(dir_ / "pre.st", "visual.merger").rows, 10);
  EXPECT_EQ(test::read_matrix(dir_ / "pre.st", "visual.blocks.0.out").rows, 40);
  EXPECT_EQ(test::read_matrix(dir_ / "pre.st", "layers.1.residual").rows, 20);
  // The prompt's 17 tokens as one prefill, the last three as decode steps: the same logits.
  r = run(common + "--decode --prefill 17 --out " + p("dec.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::read_matrix(dir_ / "dec.st", "logits").data,
            test::read_matrix(dir_ / "pre.st", "logits").data);
  r = run(common + "--decode --prefill 12 --out " + p("bad.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("must cover the last image placeholder (token 15), got 12"));
  r = run(common + "--prefill 17 --out " + p("bad.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("splits a --decode run"));
  r = run(common + "--capture 'visual.merger,logits' --out " + p("some.st"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 capture points"));
  // A golden of the same prompt stores the images; golden info says so; it judges itself PASS.
  r = run("golden make --model " + p("vl") + " --pixels " + p("px.st") + " --token-ids " + ids +
          " --out " + p("g.h5"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("1 sequence(s) of 20 tokens with 2 image(s)"));
  r = run("golden info " + p("g.h5"));
  EXPECT_THAT(r.out, HasSubstr("images     2 (40 patches, 10 image tokens, 1 deepstack features)"));
  r = run("compare " + p("g.h5") + " " + p("g.h5"));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // Pixels for a text-only checkpoint.
  ASSERT_EQ(run("make-fixture --arch qwen3 --seed " + s + " --out " + p("q3")).status, 0);
  r = run("golden make --model " + p("q3") + " --pixels " + p("px.st") +
          " --synthetic 1 --seq-len 4 --out " + p("bad.h5"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--pixels: Qwen3ForCausalLM takes no images"));
  r = run("trace --model " + p("q3") + " --pixels " + p("px.st") + " --synthetic 4 --out " +
          p("bad.st"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("has no vision tower the reference runs"));
}

}  // namespace
}  // namespace qparity
