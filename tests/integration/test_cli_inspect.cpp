// The `qparity` binary end to end: inspect on a checkpoint directory it can read, and on
// malformed inputs, where it must exit 1 with one line naming the file and key (never a crash).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../unit/test_seed.h"
#include "cli_runner.h"
#include "core/json_util.h"
#include "core/safetensors/safetensors_writer.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;

using test::CliRun;
using test::slurp;
using ::testing::HasSubstr;

class CliInspect : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qparity_cli_" + std::to_string(test::test_seed()));
    fs::create_directories(dir_ / "ckpt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliRun run(const std::string& args) { return test::run_cli(dir_, args); }

  // A 1-layer Llama checkpoint with every tensor present (bf16), plus `config`.
  void write_llama(const Json& config) {
    std::ofstream(dir_ / "ckpt/config.json") << config.dump(2);
    const int64_t h = config["hidden_size"], i = config["intermediate_size"],
                  v = config["vocab_size"];
    const int64_t nh = config["num_attention_heads"], kv = config["num_key_value_heads"];
    const int64_t d = h / nh;
    std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes = {
        {"model.embed_tokens.weight", {uint64_t(v), uint64_t(h)}},
        {"model.layers.0.input_layernorm.weight", {uint64_t(h)}},
        {"model.layers.0.self_attn.q_proj.weight", {uint64_t(nh * d), uint64_t(h)}},
        {"model.layers.0.self_attn.k_proj.weight", {uint64_t(kv * d), uint64_t(h)}},
        {"model.layers.0.self_attn.v_proj.weight", {uint64_t(kv * d), uint64_t(h)}},
        {"model.layers.0.self_attn.o_proj.weight", {uint64_t(h), uint64_t(nh * d)}},
        {"model.layers.0.post_attention_layernorm.weight", {uint64_t(h)}},
        {"model.layers.0.mlp.gate_proj.weight", {uint64_t(i), uint64_t(h)}},
        {"model.layers.0.mlp.up_proj.weight", {uint64_t(i), uint64_t(h)}},
        {"model.layers.0.mlp.down_proj.weight", {uint64_t(h), uint64_t(i)}},
        {"model.norm.weight", {uint64_t(h)}},
        {"lm_head.weight", {uint64_t(v), uint64_t(h)}}};
    storage_.clear();
    std::vector<TensorToWrite> tensors;
    for (auto& [name, shape] : shapes) {
      uint64_t n = 1;
      for (auto s : shape)
        n *= s;
      storage_.emplace_back(2 * n, 0x3F);  // bf16 0x3F3F ~ 0.746
      tensors.push_back({name, DType::kBF16, shape, storage_.back()});
    }
    write_safetensors(dir_ / "ckpt/model.safetensors", tensors,
                      std::map<std::string, std::string>{{"format", "pt"}},
                      OverwritePolicy::kReplace);
  }

  Json llama_config() {
    return Json::parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":2,
      "num_hidden_layers":1,"vocab_size":96,"rms_norm_eps":1e-5,"rope_theta":10000.0,
      "max_position_embeddings":128,"tie_word_embeddings":false,"torch_dtype":"bfloat16"})");
  }

  fs::path dir_;
  std::vector<std::vector<uint8_t>> storage_;
};

TEST_F(CliInspect, ReadsACheckpointDirectory) {
  write_llama(llama_config());
  const CliRun r = run("inspect " + (dir_ / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("model.layers.0.mlp.down_proj.weight"), std::string::npos);
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos);
  EXPECT_NE(r.out.find("model.layers.0.self_attn.q_proj"), std::string::npos);
  const CliRun j = run("inspect --json --stats " + (dir_ / "ckpt").string());
  ASSERT_EQ(j.status, 0) << j.err;
  const Json doc = Json::parse(j.out);
  EXPECT_EQ(doc["tensors"].size(), 12u);
  EXPECT_EQ(doc["model_config"]["num_layers"], 1);
  EXPECT_EQ(doc["tensors"][0]["stats"]["nan"], 0);
  EXPECT_TRUE(doc.contains("quant_plan"));
}

TEST_F(CliInspect, OverrideSchemeIsRecordedAsTheSource) {
  write_llama(llama_config());
  const CliRun r = run("inspect --json --scheme fp8-channel " + (dir_ / "ckpt").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("fp8-channel"), std::string::npos);
}

TEST_F(CliInspect, ReportsNonFiniteValues) {
  std::vector<uint8_t> bytes = {0x00, 0x3F, 0xC0, 0x7F,
                                0x80, 0x7F, 0x00, 0x00};  // 0.5, NaN, inf, 0
  write_safetensors(dir_ / "nan.safetensors", {{"x", DType::kBF16, {4}, bytes}}, std::nullopt);
  const CliRun r = run("inspect --stats " + (dir_ / "nan.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("NON-FINITE: 1 NaN, 1 Inf (first at 1)"), std::string::npos) << r.out;
}

void expect_one_line_error(const CliRun& r, const std::vector<std::string>& fragments) {
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const auto& f : fragments)
    EXPECT_NE(r.err.find(f), std::string::npos) << r.err << " / " << f;
}

TEST_F(CliInspect, MalformedInputsExitOneWithOneLine) {
  // Truncated safetensors file.
  std::ofstream(dir_ / "trunc.safetensors", std::ios::binary) << std::string("\x40\x00\x00", 3);
  expect_one_line_error(run("inspect " + (dir_ / "trunc.safetensors").string()),
                        {"trunc.safetensors", "shorter than the 8-byte header"});
  // config.json with a wrong type.
  Json cfg = llama_config();
  cfg["num_attention_heads"] = "four";
  write_llama(llama_config());
  std::ofstream(dir_ / "ckpt/config.json") << cfg.dump();
  expect_one_line_error(run("inspect " + (dir_ / "ckpt").string()),
                        {"config.json", "num_attention_heads", "expected an integer"});
  // Unknown architecture.
  cfg = llama_config();
  cfg["architectures"] = {"GPT2LMHeadModel"};
  std::ofstream(dir_ / "ckpt/config.json") << cfg.dump();
  expect_one_line_error(run("inspect " + (dir_ / "ckpt").string()),
                        {"GPT2LMHeadModel", "LlamaForCausalLM"});
  // A quantization target that matches no module.
  cfg = llama_config();
  cfg["quantization_config"] = Json::parse(R"({"quant_method":"compressed-tensors",
    "format":"float-quantized","config_groups":{"group_0":{"targets":["re:.*nonexistent.*"],
    "weights":{"num_bits":8,"type":"float","strategy":"channel","symmetric":true}}},"ignore":[]})");
  std::ofstream(dir_ / "ckpt/config.json") << cfg.dump();
  expect_one_line_error(run("inspect " + (dir_ / "ckpt").string()), {"re:.*nonexistent.*"});
  // Unknown override scheme.
  std::ofstream(dir_ / "ckpt/config.json") << llama_config().dump();
  expect_one_line_error(run("inspect --scheme w3a16 " + (dir_ / "ckpt").string()), {"w3a16"});
  // Missing path.
  expect_one_line_error(run("inspect " + (dir_ / "nope").string()), {"nope"});
}

// docs/SCHEMES.md is what `qparity schemes --markdown` prints from the registry: no second list
// to drift (regenerate it with `qparity schemes --markdown > docs/SCHEMES.md`).
TEST_F(CliInspect, SchemesDocumentIsGeneratedFromTheRegistry) {
  const CliRun md = run("schemes --markdown");
  ASSERT_EQ(md.status, 0) << md.err;
  std::ifstream f(fs::path(QPARITY_SOURCE_DIR) / "docs" / "SCHEMES.md");
  std::stringstream committed;
  committed << f.rdbuf();
  EXPECT_EQ(md.out, committed.str())
      << "docs/SCHEMES.md is stale: qparity schemes --markdown > docs/SCHEMES.md";
  EXPECT_THAT(md.out, HasSubstr("| `W4A16` | compressed-tensors | `ct-w4a16-g128` |"));
  const CliRun presets = run("schemes --presets --json");
  ASSERT_EQ(presets.status, 0) << presets.err;
  EXPECT_THAT(presets.out, HasSubstr("\"scheme\": \"ct-w4a16-g128-asym\""));
}

// tokenize --out as an attacker would meet it: a symlink at the old fixed temp name (X.tmp) must
// not redirect the write (main overwrote its target, exit 0), a user's own X.tmp stays, an
// existing output is refused without --force, and a FIFO as the text is refused, not waited on.
TEST_F(CliInspect, TokenizeWritesOnlyItsOutput) {
  const std::string model = (fs::path(QPARITY_SOURCE_DIR) / "fixtures/trained/llama").string();
  std::ofstream(dir_ / "t.txt") << "Hello, world.\n";
  std::ofstream(dir_ / "victim.txt") << "keep me";
  fs::remove(dir_ / "ids.txt.tmp");
  fs::create_symlink(dir_ / "victim.txt", dir_ / "ids.txt.tmp");
  const std::string tok =
      "tokenize --model " + model + " --text " + (dir_ / "t.txt").string() + " --out ";
  const CliRun r = run(tok + (dir_ / "ids.txt").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "victim.txt"), "keep me");
  EXPECT_TRUE(fs::is_symlink(dir_ / "ids.txt.tmp"));
  EXPECT_FALSE(slurp(dir_ / "ids.txt").empty());
  const CliRun again = run(tok + (dir_ / "ids.txt").string());
  EXPECT_EQ(again.status, 1);
  EXPECT_THAT(again.err, HasSubstr("exists"));
  EXPECT_EQ(run(tok + (dir_ / "ids.txt").string() + " --force").status, 0);
  const fs::path fifo = dir_ / "f.txt";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliRun f = run("tokenize --model " + model + " --text " + fifo.string());
  EXPECT_EQ(f.status, 1);
  EXPECT_THAT(f.err, HasSubstr("is not a regular file"));
}

TEST_F(CliInspect, UsageErrorsExitTwoAndHelpExitsZero) {
  EXPECT_EQ(run("").status, 2);
  EXPECT_EQ(run("inspect").status, 2);  // missing PATH
  EXPECT_EQ(run("inspect --bogus x").status, 2);
  EXPECT_EQ(run("--help").status, 0);
  EXPECT_EQ(run("schemes --help").status, 0);
}

}  // namespace
}  // namespace qparity
