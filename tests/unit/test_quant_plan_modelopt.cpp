// NVIDIA ModelOpt configs -> QuantPlan (schemes/description/modelopt_config.h): both file forms,
// the FP8 point and KV cache, vLLM's exclude matching, and the refusals by name.
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
    "num_hidden_layers": 12, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16"})"),
                            "config.json");
}

QuantPlan plan(const char* json) {
  return plan_from_quantization_config(llama(), Json::parse(json), "hf_quant_config.json");
}

std::string refusal(const char* json) {
  try {
    plan(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "(planned)";
}

TEST(ModelOptPlan, HfQuantConfigFp8WithKvCache) {
  const QuantPlan p = plan(R"({"producer": {"name": "modelopt", "version": "0.23.0"},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                     "exclude_modules": ["lm_head", "model.layers.1.mlp*", "layers.2.self_attn.o"]}})");
  EXPECT_EQ(p.source(), PlanSource::kModelOpt);
  const PlanEntry& q = p.method_for("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.scheme_string(), "fp8-tensor");
  EXPECT_EQ(q.format, "modelopt");
  // fnmatch: "model.layers.1.mlp*" covers layer 1's MLP, not layer 10's or 11's.
  EXPECT_FALSE(p.method_for("model.layers.1.mlp.down_proj").quantized());
  EXPECT_EQ(p.method_for("model.layers.10.mlp.down_proj").scheme_string(), "fp8-tensor");
  // vLLM's legacy substring rule.
  EXPECT_FALSE(p.method_for("model.layers.2.self_attn.o_proj").quantized());
  EXPECT_FALSE(p.method_for("lm_head").quantized());
  EXPECT_EQ(p.method_for("model.layers.0.self_attn").scheme_string(), "kv-fp8");
  EXPECT_THAT(p.rules().front(), HasSubstr("ModelOpt 0.23.0"));
}

TEST(ModelOptPlan, ConfigJsonForm) {
  const QuantPlan p = plan(R"({"quant_method": "modelopt", "quant_algo": "FP8",
    "ignore": ["lm_head"], "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"},
    "config_groups": {"group_0": {"input_activations": {"dynamic": false, "num_bits": 8,
      "type": "float"}, "weights": {"dynamic": false, "num_bits": 8, "type": "float"},
      "targets": ["Linear"]}}, "producer": {"name": "modelopt", "version": "0.37.0"}})");
  EXPECT_EQ(p.method_for("model.layers.3.mlp.up_proj").scheme_string(), "fp8-tensor");
  EXPECT_EQ(p.method_for("model.layers.3.self_attn").scheme_string(), "kv-fp8");
  EXPECT_TRUE(p.warnings().empty());
}

TEST(ModelOptPlan, PerChannelPerTokenIsFp8Channel) {
  const QuantPlan p = plan(R"({"producer": {"name": "modelopt", "version": "0.29.0"},
    "quantization": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", "kv_cache_quant_algo": null,
                     "exclude_modules": ["lm_head"]}})");
  const PlanEntry& e = p.method_for("model.layers.0.mlp.gate_proj");
  EXPECT_EQ(e.scheme_string(), "fp8-channel");
  EXPECT_EQ(e.format, "modelopt");
  ASSERT_TRUE(e.input_activations);
  EXPECT_EQ(e.input_activations->strategy, QuantStrategy::kToken);
  EXPECT_THAT(p.rules().back(), HasSubstr("weight_scale [N]"));
}

TEST(ModelOptPlan, Nvfp4AndItsWeightOnlyForm) {
  const QuantPlan p = plan(R"({"producer": {"name": "modelopt", "version": "0.35.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.0.self_attn*"]}})");
  const PlanEntry& e = p.method_for("model.layers.1.self_attn.q_proj");
  EXPECT_EQ(e.scheme_string(), "nvfp4");
  EXPECT_EQ(e.format, "modelopt");
  EXPECT_TRUE(e.input_activations.has_value());
  EXPECT_FALSE(p.method_for("model.layers.0.self_attn.q_proj").quantized());
  EXPECT_THAT(p.rules().back(), HasSubstr("w = e2m1 * s * ws2"));
  const QuantPlan a16 = plan(R"({"quantization": {"quant_algo": "W4A16_NVFP4"}})");
  EXPECT_EQ(a16.method_for("model.layers.1.mlp.up_proj").scheme_string(), "nvfp4a16");
  EXPECT_FALSE(a16.method_for("model.layers.1.mlp.up_proj").input_activations.has_value());
}

TEST(ModelOptPlan, RefusesWhatIsNotReadYetByName) {
  EXPECT_THAT(refusal(R"({"producer": {"name": "modelopt", "version": "0.35.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 32,
                     "exclude_modules": ["lm_head"]}})"),
              HasSubstr("32 is not implemented"));
  EXPECT_THAT(refusal(R"({"quantization": {"quant_algo": "MIXED_PRECISION",
                     "quantized_layers": {}}})"),
              HasSubstr("'MIXED_PRECISION' is not implemented"));
  EXPECT_THAT(refusal(R"({"quantization": {"quant_algo": "W4A8_AWQ"}})"),
              HasSubstr("'W4A8_AWQ' is not implemented"));
  EXPECT_THAT(refusal(R"({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"}})"),
              HasSubstr("'NVFP4' is not implemented (an FP8 KV cache is)"));
  EXPECT_THAT(refusal(R"({"producer": {"name": "other"}, "quantization": {"quant_algo": "FP8"}})"),
              HasSubstr("is not modelopt"));
  const QuantPlan p = plan(R"({"quantization": {"quant_algo": "fp8", "new_knob": 1}})");
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_THAT(p.warnings()[0], HasSubstr("'new_knob'"));
}

}  // namespace
}  // namespace qparity
