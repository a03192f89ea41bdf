// NVIDIA ModelOpt configs -> QuantPlan (schemes/description/modelopt_config.h): both file forms,
// the FP8 point and KV cache, vLLM's exclude matching, and the refusals by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/json_util.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_plan.h"
#include "schemes/fp8/fp8_block.h"
#include "schemes/method/method_factory.h"

namespace qparity {
namespace {

using ::testing::AllOf;
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
              HasSubstr("MIXED_PRECISION needs a non-empty quantized_layers"));
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

// FP8_PB_WO (ModelOpt's FP8_2D_BLOCKWISE_WEIGHT_ONLY) is fp8-block weights with unquantized
// inputs; MXFP8 is e4m3 with E8M0 scales per 32 and MXFP8 inputs (vLLM ModelOptMxFp8Config).
TEST(ModelOptPlan, BlockWeightOnlyAndMxfp8) {
  const QuantPlan pb = plan(R"({"producer": {"name": "modelopt", "version": "0.39.0"},
    "quantization": {"quant_algo": "FP8_PB_WO", "kv_cache_quant_algo": null,
                     "exclude_modules": ["lm_head"]}})");
  const PlanEntry& e = pb.method_for("model.layers.0.mlp.down_proj");
  EXPECT_EQ(e.scheme_string(), "fp8-block-a16");
  EXPECT_EQ(e.format, "modelopt");
  EXPECT_FALSE(e.input_activations);
  const QuantPlan mx = plan(R"({"producer": {"name": "modelopt", "version": "0.39.0"},
    "quantization": {"quant_algo": "MXFP8", "exclude_modules": ["lm_head"]}})");
  EXPECT_EQ(mx.method_for("model.layers.3.self_attn.q_proj").scheme_string(), "mxfp8");
  bool rule = false;
  for (const std::string& r : mx.rules())
    rule = rule || r.find("quant_algo MXFP8") != std::string::npos;
  EXPECT_TRUE(rule);
}

// FP8_PB_WO's tensors as ModelOpt exports them (F32 weight_scale [N/128, 1, K/128, 1]) read back
// to codes x tile scale; under the vllm dialect the inputs are quantized 1x128 as vLLM's
// ModelOptFp8PbWoLinearMethod does, weight-only everywhere else.
TEST(ModelOptPlan, BlockWeightOnlyTensorsReadBackAndVllmQuantizesTheInputs) {
  SchemeId s = parse_scheme_id("fp8-block-a16");
  reference::QuantizeRequest req;
  req.weight = Matrix(256, 384);
  for (size_t i = 0; i < req.weight.data.size(); ++i)
    req.weight.data[i] =
        std::sin(0.37 * static_cast<double>(i)) * (1.0 + static_cast<double>(i % 7));
  req.model_dtype = DType::kBF16;
  req.format = "modelopt";
  req.where = "l";
  const reference::TensorMap t = reference::quantize_linear(s, req);
  const reference::HostTensor& sc = t.at("weight_scale");
  EXPECT_EQ(sc.dtype, DType::kF32);
  EXPECT_EQ(sc.shape, (std::vector<int64_t>{2, 1, 3, 1}));
  const std::vector<double> codes = reference::decode(t.at("weight").view(), "w");
  const std::vector<double> scales = reference::decode(sc.view(), "s");
  for (const Dialect d : {Dialect::kIdeal, Dialect::kVllm}) {
    reference::MethodConfig c = reference::method_config(s, d);
    c.format = "modelopt";
    const Matrix w = reference::dequantize_linear(c, t, 256, 384, DType::kBF16);
    for (int64_t r = 0; r < 256; ++r)
      for (int64_t k = 0; k < 384; ++k)
        ASSERT_EQ(w(r, k), codes[r * 384 + k] * scales[(r / 128) * 3 + k / 128]);
    const reference::Fp8BlockLinearMethod m(reference::LinearShape::dense("l", 256, 384), c);
    EXPECT_EQ(m.activation_mode(),
              d == Dialect::kVllm ? reference::Fp8Act::kDynamicGroup : reference::Fp8Act::kNone)
        << to_string(d);
  }
}

// MIXED_PRECISION as ModelOpt exports a MoE model (the per-module quantized_layers of
// nvidia/Qwen3-30B-A3B-NVFP4-style exports: attention FP8, experts NVFP4): a listed module takes
// its algorithm, an unlisted one stays unquantized, exclude_modules wins, and what no reader
// runs is refused naming the key.
TEST(ModelOptPlan, MixedPrecisionTakesEachModulesAlgorithm) {
  const ModelConfig moe = parse_model_config(Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 4,
    "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 2, "mlp_only_layers": [1], "vocab_size": 1000, "rms_norm_eps": 1e-6,
    "norm_topk_prob": true, "torch_dtype": "bfloat16"})"),
                                             "config.json");
  Json layers = Json::object();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    for (const char* a : {"q_proj", "k_proj", "v_proj", "o_proj"})
      layers[p + ".self_attn." + a] = {{"quant_algo", "FP8"}};
  }
  for (int x = 0; x < 3; ++x)
    for (const char* a : {"gate_proj", "up_proj", "down_proj"})
      layers["model.layers.0.mlp.experts." + std::to_string(x) + "." + a] = {
          {"quant_algo", "NVFP4"}, {"group_size", 16}};
  // Expert 3 under the stack's own entry (vLLM's fused-MoE prefix lookup).
  layers["model.layers.0.mlp.experts"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
  layers["model.layers.9.mlp.down_proj"] = {{"quant_algo", "FP8"}};  // not in this model
  Json hf = {{"producer", {{"name", "modelopt"}, {"version", "0.37.0"}}},
             {"quantization",
              {{"quant_algo", "MIXED_PRECISION"},
               {"kv_cache_quant_algo", "FP8"},
               {"exclude_modules", Json::array({"lm_head", "model.layers.1.self_attn.o_proj"})},
               {"quantized_layers", layers}}}};
  const QuantPlan p = plan_from_quantization_config(moe, hf, "hf_quant_config.json");
  EXPECT_EQ(p.method_for("model.layers.0.self_attn.q_proj").scheme_string(), "fp8-tensor");
  EXPECT_EQ(p.method_for("model.layers.0.mlp.experts").scheme_string(), "nvfp4");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.gate_proj").scheme_string(), "bf16");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.gate_proj").why.note, "not in quantized_layers");
  EXPECT_EQ(p.method_for("model.layers.1.self_attn.o_proj").why.note, "excluded");
  EXPECT_EQ(p.method_for("model.layers.1.self_attn").scheme_string(), "kv-fp8");
  EXPECT_THAT(p.method_for("model.layers.0.mlp.experts.2.up_proj").why.key,
              HasSubstr("quantized_layers.model.layers.0.mlp.experts.2.up_proj"));
  EXPECT_EQ(p.method_for("model.layers.0.mlp.experts.3.up_proj").why.key,
            "quantized_layers.model.layers.0.mlp.experts");
  bool warned = false;
  for (const std::string& w : p.warnings())
    warned = warned || w.find("model.layers.9.mlp.down_proj") != std::string::npos;
  EXPECT_TRUE(warned);
  auto refused = [&](const std::string& module, const Json& info) {
    Json bad = hf;
    bad["quantization"]["quantized_layers"][module] = info;
    try {
      plan_from_quantization_config(moe, bad, "hf_quant_config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(planned)");
  };
  EXPECT_THAT(refused("model.layers.1.mlp.up_proj", {{"quant_algo", "W4A8_AWQ"}}),
              AllOf(HasSubstr("quantized_layers.model.layers.1.mlp.up_proj.quant_algo"),
                    HasSubstr("'W4A8_AWQ' is not implemented")));
  EXPECT_THAT(refused("model.layers.1.mlp.up_proj", {{"quant_algo", "NVFP4"}, {"group_size", 32}}),
              HasSubstr("32 is not implemented"));
  EXPECT_THAT(refused("model.layers.0.mlp.gate", {{"quant_algo", "FP8"}}),
              HasSubstr("a quantized lm_head or MoE router is not read"));
  // One expert of the stack in another algorithm: the stack needs one scheme.
  EXPECT_THAT(refused("model.layers.0.mlp.experts.3.down_proj", {{"quant_algo", "FP8"}}),
              HasSubstr("must share one quantization scheme"));
}

}  // namespace
}  // namespace qparity
