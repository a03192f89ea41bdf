// gpt-oss's config (GptOssConfig defaults and the released keys), YaRN's frequencies against an
// independent transcription of transformers' _compute_yarn_parameters, and quant_method mxfp4's
// plan (schemes/description/gpt_oss_mxfp4_config.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/config/model_config.h"
#include "core/config/rope_tables.h"
#include "core/error.h"
#include "core/json_util.h"
#include "error_of.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_plan.h"

namespace qparity {
namespace {

using ::testing::HasSubstr;

// openai/gpt-oss-20b's config.json as released (layer count cut to 4, sizes kept).
Json released() {
  return Json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 4, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
    "quantization_config": {
      "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head"],
      "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
    "use_cache": true, "vocab_size": 201088})");
}

using test::error_of;

TEST(GptOssConfig, ReadsTheReleasedConfig) {
  const ModelConfig c = parse_model_config(released(), "config.json");
  EXPECT_EQ(c.arch, Arch::kGptOss);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.moe_intermediate_size, 2880);
  EXPECT_TRUE(c.attention_sinks && c.router_bias && c.expert_bias && c.topk_then_softmax);
  EXPECT_EQ(c.swiglu_limit, 7.0);
  EXPECT_EQ(c.swiglu_alpha, 1.702);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.window_of(0), 128);
  EXPECT_EQ(c.window_of(1), 0);
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kYarn);
  EXPECT_EQ(c.rope_scaling.truncate, std::optional<bool>(false));
  for (int64_t i = 0; i < c.num_layers; ++i)
    EXPECT_TRUE(c.is_moe_layer(i));
  EXPECT_EQ(to_json(c).at("layer_types")[0], "sliding_attention");
}

// gpt-oss-120b: the 20b's keys with 36 layers and 128 experts (the only other MXFP4 release;
// transcribed without network access, see the issue note).
TEST(GptOssConfig, ReadsThe120bReleaseAndPlansIt) {
  Json j = released();
  j["num_hidden_layers"] = 36;
  j["num_local_experts"] = 128;
  Json types = Json::array();
  for (int i = 0; i < 36; ++i)
    types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_EQ(c.num_experts, 128);
  const QuantPlan p = plan_from_quantization_config(c, j.at("quantization_config"), "config.json");
  EXPECT_EQ(p.method_for("model.layers.35.mlp.experts.127.down_proj").scheme_string(), "mxfp4a16");
  EXPECT_FALSE(p.method_for("model.layers.35.self_attn.o_proj").quantized());
}

TEST(GptOssConfig, FillsInGptOssConfigDefaults) {
  Json j = released();
  for (const char* k : {"layer_types", "rope_scaling", "rope_theta", "sliding_window",
                        "attention_bias", "swiglu_limit"})
    j.erase(k);
  const ModelConfig c = parse_model_config(j, "config.json");
  // __post_init__: even layers slide, YaRN factor 32 / original 4096 without truncation.
  EXPECT_EQ(c.window_of(0), 128);
  EXPECT_EQ(c.window_of(3), 0);
  EXPECT_EQ(c.rope_theta, 150000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, std::optional<int64_t>(4096));
  EXPECT_EQ(c.rope_scaling.truncate, std::optional<bool>(false));
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.swiglu_limit, 7.0);
}

TEST(GptOssConfig, RefusesByName) {
  Json j = released();
  j["attention_bias"] = false;
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }), HasSubstr("attention_bias"));
  j = released();
  j["layer_types"][1] = "linear_attention";
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }), HasSubstr("layer_types[1]"));
  j = released();
  j["layer_types"].erase(0);
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }), HasSubstr("lists 3 layers"));
  j = released();
  j["experts_per_token"] = 2;
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }),
              HasSubstr("experts_per_token"));
  j = released();
  j["sliding_window"] = nullptr;
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }), HasSubstr("sliding_window"));
  j = released();
  j["swiglu_limit"] = 10.0;
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }), HasSubstr("swiglu_limit"));
  j = released();
  j["num_experts_per_tok"] = 33;
  j["experts_per_token"] = 33;
  EXPECT_THAT(error_of([&] { parse_model_config(j, "config.json"); }),
              HasSubstr("exceeds num_local_experts"));
}

// Values from a line-by-line Python transcription of _compute_yarn_parameters (math.log,
// math.floor / ceil, base ** ((2 i) / dim)), printed with repr.
TEST(YarnRope, MatchesTransformersFormula) {
  const ModelConfig c = parse_model_config(released(), "config.json");
  const RopeTable t = rope_table(c);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  const std::pair<int, double> gpt_oss[] = {{0, 1.0},
                                            {5, 0.15532298948448497},
                                            {8, 0.050813274815461475},
                                            {12, 0.006794959489732219},
                                            {20, 1.818833668168956e-05},
                                            {31, 3.0235114281192144e-07}};
  for (auto [i, v] : gpt_oss)
    EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], v, 2e-16 * v) << i;
  EXPECT_NEAR(t.attention_scaling, 1.3465735902799727, 1e-16);
  // Qwen3's published YaRN (truncate absent: HF's default true), head_dim 128.
  const std::vector<double> q = yarn_inv_freq(1e6, 128, 4.0, 32.0, 1.0, 32768.0, true);
  const std::pair<int, double> qwen[] = {{0, 1.0},
                                         {10, 0.1154781984689458},
                                         {20, 0.01333521432163324},
                                         {40, 4.445698525097307e-05},
                                         {63, 3.102344401879299e-07}};
  for (auto [i, v] : qwen)
    EXPECT_NEAR(q[static_cast<size_t>(i)], v, 2e-16 * v) << i;
  RopeScaling rs;
  rs.type = RopeType::kYarn;
  rs.factor = 4.0;
  EXPECT_NEAR(yarn_attention_factor(rs), 1.138629436111989, 1e-16);
  rs.mscale = 1.0;
  rs.mscale_all_dim = 1.0;  // DeepSeek's form: equal mscales give 1
  EXPECT_EQ(yarn_attention_factor(rs), 1.0);
  rs.attention_factor = 0.5;
  EXPECT_EQ(yarn_attention_factor(rs), 0.5);
}

TEST(YarnRope, RefusesWithoutOriginalLength) {
  Json j = released();
  j["rope_scaling"].erase("original_max_position_embeddings");
  const ModelConfig c = parse_model_config(j, "config.json");
  EXPECT_THAT(error_of([&] { rope_table(c); }), HasSubstr("original_max_position_embeddings"));
}

QuantPlan mxfp4_plan(const Json& qc) {
  return plan_from_quantization_config(parse_model_config(released(), "config.json"), qc,
                                       "config.json");
}

TEST(GptOssMxfp4Plan, ExpertsMxfp4EverythingElseUnquantized) {
  const QuantPlan p = mxfp4_plan(released().at("quantization_config"));
  EXPECT_EQ(p.source(), PlanSource::kMxfp4);
  const PlanEntry& e = p.method_for("model.layers.2.mlp.experts.7.gate_proj");
  ASSERT_TRUE(e.scheme);
  EXPECT_EQ(e.scheme_string(), "mxfp4a16");
  EXPECT_FALSE(p.method_for("model.layers.2.mlp.router").quantized());
  EXPECT_FALSE(p.method_for("model.layers.0.self_attn.q_proj").quantized());
  EXPECT_FALSE(p.method_for("lm_head").quantized());
  EXPECT_TRUE(p.warnings().empty());
}

TEST(GptOssMxfp4Plan, RefusesWhatTheEnginesWouldReadDifferently) {
  Json qc = released().at("quantization_config");
  qc["modules_to_not_convert"].push_back("model.layers.1.mlp.experts");
  EXPECT_THAT(error_of([&] { mxfp4_plan(qc); }), HasSubstr("modules_to_not_convert[4]"));
  qc = released().at("quantization_config");
  qc["modules_to_not_convert"].push_back("(");
  EXPECT_THAT(error_of([&] { mxfp4_plan(qc); }), HasSubstr("not a regular expression"));
  qc = released().at("quantization_config");
  qc["group_size"] = 32;
  const QuantPlan p = mxfp4_plan(qc);
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_THAT(p.warnings()[0], HasSubstr("group_size"));
  // A dense model has nothing mxfp4 would quantize.
  const ModelConfig llama = parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
    "rms_norm_eps": 1e-5})"),
                                               "config.json");
  EXPECT_THAT(error_of([&] {
                plan_from_quantization_config(llama, released().at("quantization_config"),
                                              "config.json");
              }),
              HasSubstr("MoE expert stacks only"));
}

}  // namespace
}  // namespace qparity
