// quant_method "gptq" and "awq" configs -> QuantPlan (schemes/description/gptq_config.h,
// awq_config.h): the points, the layouts, which linears, and every refusal by name.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/json_util.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_plan.h"

namespace qparity {
namespace {

using ::testing::HasSubstr;

ModelConfig llama() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "torch_dtype": "float16"})"),
                            "config.json");
}

ModelConfig moe() {
  return parse_model_config(Json::parse(R"({
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
      "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 4,
      "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000,
      "rms_norm_eps": 1e-6, "norm_topk_prob": true, "torch_dtype": "bfloat16"})"),
                            "config.json");
}

QuantPlan plan(const ModelConfig& cfg, const char* json) {
  return plan_from_quantization_config(cfg, Json::parse(json), "config.json");
}

std::string refusal(const ModelConfig& cfg, const char* json) {
  try {
    plan(cfg, json);
  } catch (const Error& e) {
    return e.what();
  }
  return "(planned)";
}

// AutoGPTQ's quantize_config.json keys (BaseQuantizeConfig.to_dict).
const char* kAutoGptq = R"({"bits": 4, "group_size": 128, "damp_percent": 0.01,
  "desc_act": false, "static_groups": false, "sym": true, "true_sequential": true,
  "model_name_or_path": null, "model_file_base_name": "model", "quant_method": "gptq",
  "checkpoint_format": "gptq"})";

TEST(GptqPlan, EveryDecoderLinearIsTheGptqPoint) {
  const QuantPlan p = plan(llama(), kAutoGptq);
  EXPECT_EQ(p.source(), PlanSource::kGptq);
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"}) {
    const PlanEntry& e = p.method_for(m);
    EXPECT_EQ(e.scheme_string(), "ct-w4a16-g128") << m;
    EXPECT_EQ(e.format, "gptq");
    ASSERT_TRUE(e.weights);
    EXPECT_TRUE(e.weights->symmetric);
  }
  EXPECT_FALSE(p.method_for("lm_head").quantized());
  EXPECT_THAT(p.rules().front(), HasSubstr("z - 1"));
  EXPECT_TRUE(p.warnings().empty());
}

TEST(GptqPlan, PointFieldsMapOntoTheSpace) {
  const ModelConfig cfg = llama();
  EXPECT_EQ(plan(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
                 "desc_act": true, "sym": true})")
                .method_for("model.layers.0.mlp.up_proj")
                .scheme_string(),
            "ct-w4a16-g128-actorder");
  // desc_act over one group is column order (vLLM resets it).
  EXPECT_EQ(plan(cfg, R"({"quant_method": "gptq", "bits": 8, "group_size": -1,
                 "desc_act": true, "sym": false, "checkpoint_format": "gptq_v2"})")
                .method_for("model.layers.0.mlp.up_proj")
                .scheme_string(),
            "ct-w8a16-ch-asym");
  const QuantPlan v2 = plan(cfg, R"({"quant_method": "gptq", "bits": 3, "group_size": 64,
                 "desc_act": false, "sym": true, "format": "gptq_v2", "checkpoint_format": "gptq_v2",
                 "pack_dtype": "int32", "lm_head": false, "meta": {"quantizer": ["gptqmodel:2.0"]}})");
  EXPECT_EQ(v2.method_for("model.layers.0.self_attn.o_proj").format, "gptq_v2");
  EXPECT_EQ(v2.method_for("model.layers.0.self_attn.o_proj").scheme_string(), "ct-w3a16-g64");
}

TEST(GptqPlan, WhichLinearsFollowsModulesInBlockAndDynamic) {
  const ModelConfig cfg = llama();
  const QuantPlan p = plan(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true,
    "modules_in_block_to_quantize": [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                                      ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]],
    "dynamic": {"-:.*\\.1\\.mlp\\.down_proj": {}, "+:.*\\.1\\.self_attn\\..*": {"bits": 8, "group_size": 32}}})");
  EXPECT_FALSE(p.method_for("model.layers.0.self_attn.o_proj").quantized());
  EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").scheme_string(), "ct-w4a16-g128");
  EXPECT_FALSE(p.method_for("model.layers.1.mlp.down_proj").quantized());
  EXPECT_EQ(p.method_for("model.layers.1.self_attn.k_proj").scheme_string(), "ct-w8a16-g32");
  EXPECT_THAT(p.method_for("model.layers.1.self_attn.k_proj").why.key, HasSubstr("dynamic"));
  // An override of a field this reader cannot honour changes the math: refused.
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "dynamic": {".*": {"damp_percent": 0.1, "pack_dtype": "int8"}}})"),
              HasSubstr("not implemented"));
}

TEST(GptqPlan, RefusesLayoutsAndWidthsByName) {
  const ModelConfig cfg = llama();
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "checkpoint_format": "marlin"})"),
              HasSubstr("checkpoint_format"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "is_marlin_format": true})"),
              HasSubstr("is_marlin_format"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "pack_dtype": "int16"})"),
              HasSubstr("pack_dtype"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 5, "group_size": 128,
    "desc_act": false, "sym": true})"),
              HasSubstr("bits 5"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "group_size": 128})"), HasSubstr("bits"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 96,
    "desc_act": false, "sym": true})"),
              HasSubstr("96"));
  // Unknown keys are listed, not fatal.
  const QuantPlan p = plan(cfg, R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
    "desc_act": false, "sym": true, "surprise": 1})");
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_THAT(p.warnings()[0], HasSubstr("'surprise'"));
}

TEST(GptqPlan, MoeExpertsAreQuantizedRoutersNot) {
  const QuantPlan p = plan(moe(), kAutoGptq);
  EXPECT_EQ(p.method_for("model.layers.0.mlp.experts.1.down_proj").scheme_string(),
            "ct-w4a16-g128");
  EXPECT_FALSE(p.method_for("model.layers.0.mlp.gate").quantized());
}

// AutoAWQ's to_transformers_dict keys.
const char* kAutoAwq = R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null,
  "quant_method": "awq", "version": "gemm", "zero_point": true})";

TEST(AwqPlan, EveryDecoderLinearIsTheAsymmetricInt4Point) {
  const QuantPlan p = plan(llama(), kAutoAwq);
  EXPECT_EQ(p.source(), PlanSource::kAwq);
  const PlanEntry& e = p.method_for("model.layers.0.mlp.gate_proj");
  EXPECT_EQ(e.scheme_string(), "ct-w4a16-g128-asym");
  EXPECT_EQ(e.format, "awq");
  EXPECT_FALSE(p.method_for("lm_head").quantized());
  // Legacy AutoAWQ names; modules_to_not_convert is a substring match.
  const QuantPlan q = plan(llama(), R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 64,
    "zero_point": true, "version": "GEMM", "modules_to_not_convert": ["layers.1.mlp"]})");
  EXPECT_EQ(q.method_for("model.layers.0.mlp.up_proj").scheme_string(), "ct-w4a16-g64-asym");
  EXPECT_FALSE(q.method_for("model.layers.1.mlp.up_proj").quantized());
  EXPECT_EQ(q.method_for("model.layers.1.self_attn.q_proj").scheme_string(), "ct-w4a16-g64-asym");
}

TEST(AwqPlan, RefusesOtherLayoutsByName) {
  const ModelConfig cfg = llama();
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "awq", "bits": 4, "group_size": 128,
    "zero_point": true, "version": "gemv"})"),
              HasSubstr("'gemv' is not implemented"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "awq", "bits": 4, "group_size": 128,
    "zero_point": false, "version": "gemm"})"),
              HasSubstr("zero_point"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "awq", "bits": 8, "group_size": 128,
    "zero_point": true})"),
              HasSubstr("4-bit"));
  EXPECT_THAT(refusal(cfg, R"({"quant_method": "awq", "bits": 4, "group_size": 128,
    "zero_point": true, "backend": "llm-awq"})"),
              HasSubstr("backend"));
}

// A checkpoint whose config.json has no quantization_config, with AutoGPTQ's quantize_config.json
// (no quant_method) beside it: read as GPTQ, the implied method named as a rule.
TEST(GptqPlan, AutoGptqSideFileIsRead) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("qparity_gptq_side_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "float16"})";
  std::ofstream(dir / "quantize_config.json") << R"({"bits": 4, "group_size": 128,
    "damp_percent": 0.01, "desc_act": false, "sym": true, "true_sequential": true})";
  const QuantPlan p = build_quant_plan(llama(), dir, std::nullopt);
  EXPECT_EQ(p.source(), PlanSource::kGptq);
  EXPECT_THAT(p.source_file(), HasSubstr("quantize_config.json"));
  EXPECT_EQ(p.method_for("model.layers.0.mlp.up_proj").format, "gptq");
  EXPECT_THAT(p.rules().back(), HasSubstr("has no quant_method: read as \"gptq\""));
  std::filesystem::remove_all(dir);
}

// Producer side files as an attacker gives them: a FIFO (never waited on), a duplicate key (the
// later value would silently win), an empty file, a non-object; each an Error naming the file.
TEST(GptqPlan, SideFilesAsAnAttackerGivesThem) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("qparity_side_attack_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "float16"})";
  const auto error_of = [&] {
    try {
      build_quant_plan(llama(), dir, std::nullopt);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(planned)");
  };
  ASSERT_EQ(mkfifo((dir / "quantize_config.json").c_str(), 0600), 0);
  EXPECT_THAT(error_of(), HasSubstr("quantize_config.json"));
  EXPECT_THAT(error_of(), HasSubstr("not a regular file"));
  std::filesystem::remove(dir / "quantize_config.json");
  std::ofstream(dir / "quant_config.json") << R"({"w_bit": 4, "q_group_size": 128,
    "zero_point": true, "w_bit": 8})";
  EXPECT_THAT(error_of(), HasSubstr("duplicate key 'w_bit'"));
  std::ofstream(dir / "quant_config.json", std::ios::trunc) << "";
  EXPECT_THAT(error_of(), HasSubstr("quant_config.json"));
  std::filesystem::remove(dir / "quant_config.json");
  std::ofstream(dir / "hf_quant_config.json") << "[1, 2]";
  EXPECT_THAT(error_of(), HasSubstr("hf_quant_config.json"));
  std::ofstream(dir / "hf_quant_config.json", std::ios::trunc)
      << R"({"quantization": {"quant_algo": "FP8", "exclude_modules": "lm_head"}})";
  EXPECT_THAT(error_of(), HasSubstr("not a list of module names"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qparity
