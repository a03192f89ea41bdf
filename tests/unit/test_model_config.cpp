// HF config.json -> ModelConfig: real-looking configs of the three supported architectures, and
// malformed ones whose messages must name the key and the rule.
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/config/model_config.h"
#include "core/error.h"

#include "error_of.h"

namespace qparity {
namespace {

using ::testing::HasSubstr;

using test::error_of;

// meta-llama/Llama-3.1-8B-Instruct
Json llama31_8b() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": true,
    "vocab_size": 128256
  })");
}

// Qwen/Qwen3-0.6B
Json qwen3_06b() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000,
    "sliding_window": null,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// Qwen/Qwen3-30B-A3B
Json qwen3_30b_a3b() {
  return Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": true,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": false,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": null,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

ModelConfig parse(const Json& j) {
  return parse_model_config(j, "config.json");
}

TEST(ModelConfig, Llama31WithLlama3Rope) {
  const ModelConfig c = parse(llama31_8b());
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.arch_name, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads
  EXPECT_EQ(c.q_size(), 4096);
  EXPECT_EQ(c.kv_size(), 1024);
  EXPECT_EQ(c.intermediate, 14336);
  EXPECT_EQ(c.vocab, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(*c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(*c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(*c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.has_qk_norm);
  EXPECT_FALSE(c.is_moe());
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.hidden_act, "silu");
}

TEST(ModelConfig, Qwen3SmallExplicitHeadDimAndTiedEmbeddings) {
  const ModelConfig c = parse(qwen3_06b());
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(c.q_size(), 2048);
  EXPECT_EQ(c.kv_size(), 1024);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
}

TEST(ModelConfig, Qwen3MoeAllLayersSparse) {
  const ModelConfig c = parse(qwen3_30b_a3b());
  EXPECT_EQ(c.arch, Arch::kQwen3Moe);
  EXPECT_TRUE(c.is_moe());
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.intermediate, 6144);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  for (int64_t i = 0; i < c.num_layers; ++i)
    EXPECT_TRUE(c.is_moe_layer(i)) << i;
}

TEST(ModelConfig, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  Json j = qwen3_30b_a3b();
  j["num_hidden_layers"] = 8;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3, 5};
  j["norm_topk_prob"] = false;
  const ModelConfig c = parse(j);
  // Sparse iff (i + 1) % 2 == 0 and i not in {3, 5}: layers 1 and 7.
  const bool expected[] = {false, true, false, false, false, false, false, true};
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(c.is_moe_layer(i), expected[i]) << i;
  EXPECT_FALSE(c.norm_topk_prob);
  const Json out = to_json(c);
  EXPECT_EQ(out["moe"]["sparse_layers"], Json({1, 7}));
  EXPECT_EQ(out["moe"]["mlp_only_layers"], Json({3, 5}));
}

TEST(ModelConfig, MoeDefaultsFollowHf) {
  Json j = qwen3_30b_a3b();
  j.erase("decoder_sparse_step");
  j.erase("mlp_only_layers");
  j.erase("norm_topk_prob");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_FALSE(c.norm_topk_prob);  // HF Qwen3MoeConfig default
}

TEST(ModelConfig, MissingRequiredField) {
  Json j = llama31_8b();
  j.erase("hidden_size");
  EXPECT_EQ(error_of([&] { parse(j); }), "config.json: missing required key 'hidden_size'");
  Json m = qwen3_30b_a3b();
  m.erase("moe_intermediate_size");
  EXPECT_EQ(error_of([&] { parse(m); }),
            "config.json: missing required key 'moe_intermediate_size'");
  Json a = llama31_8b();
  a.erase("architectures");
  EXPECT_EQ(error_of([&] { parse(a); }), "config.json: missing required key 'architectures'");
}

TEST(ModelConfig, WrongType) {
  Json j = llama31_8b();
  j["num_attention_heads"] = "32";
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: key 'num_attention_heads': expected an integer, got string");
  Json b = llama31_8b();
  b["tie_word_embeddings"] = 1;
  EXPECT_EQ(error_of([&] { parse(b); }),
            "config.json: key 'tie_word_embeddings': expected true or false, got integer");
  Json e = llama31_8b();
  e["rms_norm_eps"] = "1e-5";
  EXPECT_EQ(error_of([&] { parse(e); }),
            "config.json: key 'rms_norm_eps': expected a number, got string");
  Json f = llama31_8b();
  f["hidden_size"] = 4096.5;
  EXPECT_EQ(error_of([&] { parse(f); }),
            "config.json: key 'hidden_size': expected an integer, got 4096.5");
}

TEST(ModelConfig, IntegralFloatsAreAccepted) {
  Json j = llama31_8b();
  j["hidden_size"] = 4096.0;
  EXPECT_EQ(parse(j).hidden, 4096);
}

TEST(ModelConfig, NonPositiveSizes) {
  Json j = llama31_8b();
  j["hidden_size"] = 0;
  EXPECT_EQ(error_of([&] { parse(j); }), "config.json: key 'hidden_size': must be positive, got 0");
  Json n = llama31_8b();
  n["num_hidden_layers"] = -2;
  EXPECT_EQ(error_of([&] { parse(n); }),
            "config.json: key 'num_hidden_layers': must be positive, got -2");
  Json kv = llama31_8b();
  kv["num_key_value_heads"] = 0;
  EXPECT_EQ(error_of([&] { parse(kv); }),
            "config.json: key 'num_key_value_heads': must be positive, got 0");
  Json eps = llama31_8b();
  eps["rms_norm_eps"] = 0.0;
  EXPECT_THAT(error_of([&] { parse(eps); }),
              HasSubstr("config.json: key 'rms_norm_eps': must be positive"));
  Json e = qwen3_30b_a3b();
  e["num_experts"] = 0;
  EXPECT_EQ(error_of([&] { parse(e); }), "config.json: key 'num_experts': must be positive, got 0");
}

TEST(ModelConfig, ImplausibleSizesAreRejected) {
  Json j = llama31_8b();
  j["num_hidden_layers"] = 100000;
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: key 'num_hidden_layers': 100000 exceeds the supported maximum 4096");
  Json e = qwen3_30b_a3b();
  e["num_experts"] = 1000000;
  EXPECT_THAT(error_of([&] { parse(e); }), HasSubstr("exceeds the supported maximum 4096"));
}

TEST(ModelConfig, HeadDivisibility) {
  Json j = llama31_8b();
  j["num_attention_heads"] = 12;
  j["num_key_value_heads"] = 5;
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: num_attention_heads (12) is not divisible by num_key_value_heads (5)");
  Json h = llama31_8b();
  h["hidden_size"] = 4100;
  EXPECT_EQ(error_of([&] { parse(h); }),
            "config.json: hidden_size (4100) is not divisible by num_attention_heads (32) and "
            "head_dim is not given");
  // An explicit head_dim lifts the hidden/heads rule (Llama's config has head_dim too).
  h["head_dim"] = 128;
  EXPECT_EQ(parse(h).head_dim, 128);
}

TEST(ModelConfig, Qwen3NeedsExplicitHeadDim) {
  Json j = qwen3_06b();
  j.erase("head_dim");
  EXPECT_THAT(error_of([&] { parse(j); }),
              HasSubstr("config.json: missing required key 'head_dim' (Qwen3ForCausalLM"));
}

TEST(ModelConfig, UnknownArchitectureListsSupported) {
  Json j = llama31_8b();
  j["architectures"] = {"MixtralForCausalLM"};
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: key 'architectures': unsupported architecture 'MixtralForCausalLM' "
            "(supported: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
            "MistralForCausalLM, ChatGLMModel, ChatGLMForConditionalGeneration, "
            "Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, "
            "Qwen3VLForConditionalGeneration, GptOssForCausalLM)");
  EXPECT_EQ(supported_architectures(),
            (std::vector<std::string>{"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                      "MistralForCausalLM", "ChatGLMModel",
                                      "ChatGLMForConditionalGeneration", "Qwen3_5ForCausalLM",
                                      "Qwen3_5ForConditionalGeneration",
                                      "Qwen3VLForConditionalGeneration", "GptOssForCausalLM"}));
  Json e = llama31_8b();
  e["architectures"] = Json::array();
  EXPECT_EQ(error_of([&] { parse(e); }), "config.json: key 'architectures': is empty");
}

TEST(ModelConfig, ModelTypeMustMatchArchitecture) {
  Json j = qwen3_06b();
  j["model_type"] = "qwen2";
  EXPECT_THAT(error_of([&] { parse(j); }),
              HasSubstr("key 'model_type': 'qwen2' does not match architecture Qwen3ForCausalLM"));
}

TEST(ModelConfig, YarnIsReadAndDynamicIsRejectedByName) {
  // Qwen3's published YaRN (its model card's rope_scaling): read, truncate left to HF's default.
  Json j = qwen3_06b();
  j["rope_scaling"] = Json::parse(
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})");
  const ModelConfig y = parse(j);
  EXPECT_EQ(y.rope_scaling.type, RopeType::kYarn);
  EXPECT_EQ(y.rope_scaling.factor, 4.0);
  EXPECT_FALSE(y.rope_scaling.truncate.has_value());
  Json d = llama31_8b();
  d["rope_scaling"] = Json::parse(R"({"type": "dynamic", "factor": 2.0})");
  EXPECT_EQ(error_of([&] { parse(d); }),
            "config.json: rope_scaling type 'dynamic' is not implemented by the qparity reference "
            "(implemented: default, linear, llama3, yarn)");
}

TEST(ModelConfig, RopeVariantsParse) {
  const RopeScaling y = parse_rope_scaling(Json::parse(R"({"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32768})"),
                                           "rope_scaling");
  EXPECT_EQ(y.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(y.factor, 4.0);
  EXPECT_EQ(*y.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(*y.beta_fast, 32.0);  // HF defaults
  EXPECT_DOUBLE_EQ(*y.beta_slow, 1.0);
  EXPECT_FALSE(y.attention_factor.has_value());

  const RopeScaling d = parse_rope_scaling(Json::parse(R"({"type": "dynamic", "factor": 2})"), "x");
  EXPECT_EQ(d.type, RopeType::kDynamic);
  EXPECT_DOUBLE_EQ(d.factor, 2.0);

  const RopeScaling l = parse_rope_scaling(
      Json::parse(R"({"rope_type": "longrope", "short_factor": [1, 1.5], "long_factor": [2, 3],
                      "original_max_position_embeddings": 4096})"),
      "x");
  EXPECT_EQ(l.type, RopeType::kLongrope);
  EXPECT_EQ(l.long_factor, (std::vector<double>{2.0, 3.0}));
  EXPECT_FALSE(rope_type_implemented(RopeType::kLongrope));

  EXPECT_THAT(error_of([] { parse_rope_scaling(Json::parse(R"({"rope_type": "su"})"), "x"); }),
              HasSubstr("unknown rope type 'su' (known: default, linear, dynamic, llama3, yarn, "
                        "longrope)"));
  EXPECT_THAT(
      error_of([] { parse_rope_scaling(Json::parse(R"({"rope_type": "yarn"})"), "rope_scaling"); }),
      HasSubstr("rope_scaling: missing required key 'factor'"));
}

TEST(ModelConfig, LegacyTypeKeyForLinearRope) {
  Json j = llama31_8b();
  j["rope_scaling"] = Json::parse(R"({"type": "linear", "factor": 2.0})");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  j["rope_scaling"] = Json::parse(R"({"type": "linear", "rope_type": "llama3", "factor": 2.0})");
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("disagree"));
}

TEST(ModelConfig, Llama3RopeValidation) {
  Json j = llama31_8b();
  j["rope_scaling"].erase("low_freq_factor");
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: key 'rope_scaling': missing required key 'low_freq_factor'");
  Json k = llama31_8b();
  k["rope_scaling"]["high_freq_factor"] = 1.0;
  EXPECT_THAT(error_of([&] { parse(k); }),
              HasSubstr("llama3 rope needs high_freq_factor (1) > low_freq_factor (1)"));
}

TEST(ModelConfig, Transformers5RopeParameters) {
  Json j = llama31_8b();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = Json::parse(R"({
      "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.dtype, "bfloat16");

  Json q = qwen3_06b();
  q.erase("rope_scaling");
  q.erase("rope_theta");
  q["rope_parameters"] = Json::parse(R"({"rope_type": "default", "rope_theta": 1000000.0})");
  const ModelConfig qc = parse(q);
  EXPECT_EQ(qc.rope_scaling.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(qc.rope_theta, 1e6);

  q["rope_parameters"] = Json::parse(R"({"rope_type": "longrope", "short_factor": [1.0],
                                          "long_factor": [1.0]})");
  EXPECT_EQ(error_of([&] { parse(q); }),
            "config.json: rope_parameters type 'longrope' is not implemented by the qparity "
            "reference (implemented: default, linear, llama3, yarn)");
}

TEST(ModelConfig, UnimplementedFeaturesAreRejectedByName) {
  Json a = llama31_8b();
  a["hidden_act"] = "gelu";
  EXPECT_THAT(error_of([&] { parse(a); }),
              HasSubstr("key 'hidden_act': 'gelu' is not implemented by the qparity reference"));
  Json s = qwen3_06b();
  s["use_sliding_window"] = true;
  EXPECT_THAT(error_of([&] { parse(s); }),
              HasSubstr("sliding-window attention is not implemented"));
  Json p = llama31_8b();
  p["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(error_of([&] { parse(p); }),
              HasSubstr("partial_rotary_factor 0.5 is not implemented"));
  Json t = llama31_8b();
  t["torch_dtype"] = "int8";
  EXPECT_EQ(error_of([&] { parse(t); }),
            "config.json: key 'torch_dtype': unsupported model dtype 'int8' (expected bfloat16, "
            "float16 or float32)");
}

TEST(ModelConfig, MoeValidation) {
  Json j = qwen3_30b_a3b();
  j["num_experts_per_tok"] = 129;
  EXPECT_EQ(error_of([&] { parse(j); }),
            "config.json: num_experts_per_tok (129) exceeds num_experts (128)");
  Json m = qwen3_30b_a3b();
  m["mlp_only_layers"] = {0, 48};
  EXPECT_EQ(error_of([&] { parse(m); }),
            "config.json: key 'mlp_only_layers[1]': layer 48 is out of range [0, 48)");
  Json s = qwen3_30b_a3b();
  s["decoder_sparse_step"] = 0;
  EXPECT_EQ(error_of([&] { parse(s); }),
            "config.json: key 'decoder_sparse_step': must be positive, got 0");
}

TEST(ModelConfig, ToJsonIsTheNormalizedView) {
  const Json j = to_json(parse(llama31_8b()));
  EXPECT_EQ(j["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_FALSE(j.contains("moe"));
}

TEST(ModelConfig, LoadFromFile) {
  const auto dir = std::filesystem::temp_directory_path() / "qparity_test_model_config";
  std::filesystem::create_directories(dir);
  const auto path = dir / "config.json";
  std::ofstream(path) << qwen3_06b().dump(2);
  const ModelConfig c = load_model_config(path);
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_THAT(error_of([&] { load_model_config(dir / "missing.json"); }),
              HasSubstr("missing.json: no such JSON file"));
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------- Mistral, Yi, ChatGLM2

Json mistral_7b_v01() {  // mistralai/Mistral-7B-v0.1 config.json
  return Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0",
    "use_cache": true, "vocab_size": 32000})");
}

TEST(ModelConfig, MistralSlidingWindow) {
  const ModelConfig c = parse(mistral_7b_v01());
  EXPECT_EQ(c.arch, Arch::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_FALSE(c.rope_interleaved);
  Json j = mistral_7b_v01();
  j["sliding_window"] = nullptr;  // v0.2 / v0.3: full attention
  EXPECT_EQ(parse(j).sliding_window, 0);
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(parse(j).sliding_window, 4096);
  j["sliding_window"] = 0;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("sliding_window"));
  j = mistral_7b_v01();
  j["model_type"] = "llama";
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("expected 'mistral'"));
}

TEST(ModelConfig, YiIsALlama) {  // 01-ai/Yi-6B config.json (Llama-compatible since its 2023 update)
  const ModelConfig c = parse(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 4,
    "pad_token_id": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 5000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0", "use_cache": true, "vocab_size": 64000})"));
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.rope_theta, 5000000.0);
  EXPECT_EQ(c.sliding_window, 0);
}

// Qwen3_5TextConfig()'s defaults as transformers 5.17 writes them (to_json_string), with the
// architectures key a checkpoint carries; the layer list shortened to 8 layers.
Json qwen3_5_text() {
  return Json::parse(R"({
    "architectures": ["Qwen3_5ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": null, "eos_token_id": null, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 32768,
    "model_type": "qwen3_5_text", "num_attention_heads": 16, "num_hidden_layers": 8,
    "num_key_value_heads": 4, "pad_token_id": null, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0,
                        "rope_type": "default", "mrope_section": [11, 11, 10],
                        "mrope_interleaved": true},
    "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": true,
    "vocab_size": 248320})");
}

TEST(ModelConfig, Qwen3_5HybridLayersAndGatedDeltaNetSizes) {
  const ModelConfig c = parse(qwen3_5_text());
  EXPECT_EQ(c.arch, Arch::kQwen3_5);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(c.is_linear_attention_layer(i), i % 4 != 3) << i;
  EXPECT_EQ(c.linear.conv_kernel, 4);
  EXPECT_EQ(c.linear.key_dim(), 16 * 128);
  EXPECT_EQ(c.linear.value_dim(), 32 * 128);
  EXPECT_EQ(c.linear.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rotary_dim, 64);  // int(256 * 0.25)
  EXPECT_FALSE(c.rope_interleaved);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_EQ(c.q_proj_size(), 2 * 16 * 256);
  EXPECT_EQ(to_json(c)["layer_types"][3], "full_attention");

  // Without layer_types: every full_attention_interval-th layer (default 4) is full attention.
  Json j = qwen3_5_text();
  j.erase("layer_types");
  j["full_attention_interval"] = 2;
  const ModelConfig every2 = parse(j);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(every2.is_linear_attention_layer(i), i % 2 == 0) << i;
  j.erase("full_attention_interval");
  EXPECT_FALSE(parse(j).is_linear_attention_layer(7));
  EXPECT_TRUE(parse(j).is_linear_attention_layer(6));
  // partial_rotary_factor absent everywhere: Qwen3_5TextConfig's 0.25.
  j = qwen3_5_text();
  j.erase("partial_rotary_factor");
  j["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(parse(j).rotary_dim, 64);
}

TEST(ModelConfig, Qwen3_5RefusesWhatTheReferenceDoesNotCompute) {
  Json j = qwen3_5_text();
  j["layer_types"][2] = "sliding_attention";
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("layer_types[2]"));
  j = qwen3_5_text();
  j["layer_types"].erase(0);
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("lists 7 layers"));
  j = qwen3_5_text();
  j["linear_num_value_heads"] = 24;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("not a multiple of linear_num_key_heads"));
  j = qwen3_5_text();
  j["attn_output_gate"] = false;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("attn_output_gate"));
  j = qwen3_5_text();
  j["layer_scale"] = true;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("layer_scale"));
  j = qwen3_5_text();
  j["rope_parameters"]["partial_rotary_factor"] = 0.01;  // 256 * 0.01 = 2.56 -> 2: even, fine
  EXPECT_EQ(parse(j).rotary_dim, 2);
  j["rope_parameters"]["partial_rotary_factor"] = 0.005;  // 1: odd
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("rotary dim 1"));
  // Other architectures still refuse linear attention and partial rotary, by name.
  Json llama = qwen3_5_text();
  llama["architectures"] = {"LlamaForCausalLM"};
  llama["model_type"] = "llama";
  EXPECT_THAT(error_of([&] { parse(llama); }), HasSubstr("linear_attention"));
}

Json chatglm2_6b() {  // THUDM/chatglm2-6b config.json (auto_map omitted)
  return Json::parse(R"({
    "_name_or_path": "THUDM/chatglm2-6b", "model_type": "chatglm",
    "architectures": ["ChatGLMModel"], "add_bias_linear": false, "add_qkv_bias": true,
    "apply_query_key_layer_scaling": true, "apply_residual_connection_post_layernorm": false,
    "attention_dropout": 0.0, "attention_softmax_in_fp32": true, "bias_dropout_fusion": true,
    "ffn_hidden_size": 13696, "fp32_residual_connection": false, "hidden_dropout": 0.0,
    "hidden_size": 4096, "kv_channels": 128, "layernorm_epsilon": 1e-05,
    "multi_query_attention": true, "multi_query_group_num": 2, "num_attention_heads": 32,
    "num_layers": 28, "original_rope": true, "padded_vocab_size": 65024, "post_layer_norm": true,
    "rmsnorm": true, "seq_length": 32768, "use_cache": true, "torch_dtype": "float16",
    "transformers_version": "4.27.1", "tie_word_embeddings": false, "eos_token_id": 2,
    "pad_token_id": 0})");
}

TEST(ModelConfig, ChatGlm2PublishedConfig) {
  const ModelConfig c = parse(chatglm2_6b());
  EXPECT_EQ(c.arch, Arch::kChatGlm2);
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate, 13696);
  EXPECT_EQ(c.vocab, 65024);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_TRUE(c.has_qkv_bias());
  EXPECT_FALSE(c.attention_bias);  // no bias on dense (o_proj)
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "float16");
  Json j = chatglm2_6b();
  j["rope_ratio"] = 50.0;  // ChatGLM3-6B-32k
  EXPECT_EQ(parse(j).rope_theta, 500000.0);
  j = chatglm2_6b();
  j["multi_query_attention"] = false;
  EXPECT_EQ(parse(j).num_kv_heads, 32);
  j = chatglm2_6b();
  j["architectures"] = {"ChatGLMForConditionalGeneration"};
  EXPECT_EQ(parse(j).arch, Arch::kChatGlm2);
}

TEST(ModelConfig, ChatGlm2RefusesWhatTheReferenceDoesNotCompute) {
  const std::vector<std::pair<std::string, Json>> cases = {
      {"rmsnorm", false},
      {"apply_residual_connection_post_layernorm", true},
      {"post_layer_norm", false},
      {"add_bias_linear", true},
      {"fp32_residual_connection", true},
      {"quantization_bit", 4},
      {"pre_seq_len", 128},
  };
  for (const auto& [key, v] : cases) {
    Json j = chatglm2_6b();
    j[key] = v;
    EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr(key)) << key;
  }
  Json j = chatglm2_6b();
  j["multi_query_group_num"] = 3;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("multi_query_group_num"));
  j = chatglm2_6b();
  j["model_type"] = "llama";
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("expected 'chatglm'"));
}

// Qwen/Qwen3-VL-2B-Instruct's config.json (the vision_config abridged to the keys that size it).
Json qwen3_vl_2b() {
  return Json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": {
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
      "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
      "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                       "rope_type": "default"},
      "rope_theta": 5000000, "tie_word_embeddings": true, "use_cache": true,
      "vocab_size": 151936},
    "tie_word_embeddings": true, "transformers_version": "4.57.0.dev0",
    "video_token_id": 151656,
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24,
                      "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1024,
                      "intermediate_size": 4096, "model_type": "qwen3_vl", "num_heads": 16,
                      "num_position_embeddings": 2304, "out_hidden_size": 2048,
                      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
    "vision_end_token_id": 151653, "vision_start_token_id": 151652})");
}

TEST(ModelConfig, Qwen3VlIsReadAsItsTextDecoder) {
  const ModelConfig c = parse(qwen3_vl_2b());
  EXPECT_EQ(c.arch, Arch::kQwen3Vl);
  EXPECT_EQ(c.arch_name, "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(c.model_type, "qwen3_vl");
  EXPECT_TRUE(c.image_text);
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_EQ(c.rope_theta, 5000000.0);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_TRUE(c.has_qk_norm);
  EXPECT_FALSE(c.attn_output_gate);
  EXPECT_FALSE(c.zero_centred_norms);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(to_json(c)["image_text"], true);

  // The tie given only at the top level (transformers keeps it there) is the text model's.
  Json j = qwen3_vl_2b();
  j["text_config"].erase("tie_word_embeddings");
  EXPECT_TRUE(parse(j).tie_word_embeddings);
  j["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse(j).tie_word_embeddings);
}

TEST(ModelConfig, Qwen3_5ConditionalGenerationIsReadAsItsTextModel) {
  Json text = qwen3_5_text();
  text.erase("architectures");
  const Json j = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                  {"model_type", "qwen3_5"},
                  {"text_config", text},
                  {"vision_config", {{"depth", 27}, {"hidden_size", 1152}}},
                  {"tie_word_embeddings", false}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, Arch::kQwen3_5);
  EXPECT_EQ(c.arch_name, "Qwen3_5ForConditionalGeneration");
  EXPECT_TRUE(c.image_text);
  EXPECT_TRUE(c.is_linear_attention_layer(0));
  EXPECT_FALSE(c.is_linear_attention_layer(3));
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_FALSE(parse(qwen3_5_text()).image_text);
}

TEST(ModelConfig, ImageTextConfigErrorsNameTheKey) {
  Json j = qwen3_vl_2b();
  j.erase("text_config");
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("'text_config'"));
  j = qwen3_vl_2b();
  j["text_config"]["model_type"] = "qwen3";
  EXPECT_THAT(error_of([&] { parse(j); }),
              HasSubstr("key 'text_config': key 'model_type': 'qwen3' is not "
                        "Qwen3VLForConditionalGeneration's language model (expected "
                        "'qwen3_vl_text')"));
  j = qwen3_vl_2b();
  j["model_type"] = "qwen3_5";
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("'qwen3_5' does not match"));
  j = qwen3_vl_2b();
  j["tie_word_embeddings"] = false;
  EXPECT_THAT(error_of([&] { parse(j); }),
              HasSubstr("key 'tie_word_embeddings': false disagrees with text_config's true"));
  j = qwen3_vl_2b();
  j["text_config"]["rope_scaling"]["mrope_section"] = {24, 20};
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("'mrope_section': must be a list of 3"));
  j = qwen3_vl_2b();
  j["text_config"]["num_hidden_layers"] = 0;
  EXPECT_THAT(error_of([&] { parse(j); }), HasSubstr("key 'text_config': key 'num_hidden_layers'"));
  // The text decoder's class is read inside text_config only; no checkpoint is one.
  Json t = qwen3_vl_2b()["text_config"];
  t["architectures"] = {"Qwen3VLTextModel"};
  EXPECT_THAT(error_of([&] { parse(t); }),
              HasSubstr("unsupported architecture 'Qwen3VLTextModel'"));
}

}  // namespace
}  // namespace qparity
