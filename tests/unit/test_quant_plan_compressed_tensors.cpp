// config.json quantization_config (compressed-tensors and quant_method fp8) -> QuantPlan: every
// preset shape, target matching with Python re.match semantics, ignore, KV cache, expert stacks,
// and the errors that name the module and the violated constraint.
#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/config/model_config.h"
#include "core/error.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_args.h"
#include "schemes/description/quant_plan.h"

#include "error_of.h"

namespace qparity {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using test::error_of;

// Two layers, K a multiple of 128 everywhere so that every scheme's group divides it.
ModelConfig tiny_llama(bool tied = false) {
  Json j = Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"})");
  j["tie_word_embeddings"] = tied;
  return parse_model_config(j, "config.json");
}

// Layer 0 sparse (4 experts), layer 1 dense (mlp_only_layers).
ModelConfig tiny_qwen3_moe() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 4,
    "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 2, "mlp_only_layers": [1], "vocab_size": 1000, "rms_norm_eps": 1e-6,
    "norm_topk_prob": true, "torch_dtype": "bfloat16"})"),
                            "config.json");
}

QuantPlan plan_of(const ModelConfig& cfg, const char* qc) {
  return plan_from_quantization_config(cfg, Json::parse(qc), "config.json");
}

std::string scheme_of(const QuantPlan& p, const std::string& prefix) {
  return p.method_for(prefix).scheme_string();
}

const char* const kLinears[] = {
    "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj",
    "model.layers.0.mlp.gate_proj",    "model.layers.0.mlp.up_proj",
    "model.layers.0.mlp.down_proj",    "model.layers.1.self_attn.q_proj",
    "model.layers.1.mlp.down_proj"};

void expect_all_linears(const QuantPlan& p, const std::string& scheme) {
  for (const char* l : kLinears)
    EXPECT_EQ(scheme_of(p, l), scheme) << l;
  EXPECT_EQ(scheme_of(p, "lm_head"), "bf16");
}

// ---------------------------------------------------------------------------------------------
// QuantizationArgs

QuantArgs qa(const char* j) {
  return parse_quant_args(Json::parse(j), "args");
}

TEST(QuantArgs, StrategyInferenceAndNormalization) {
  EXPECT_EQ(qa(R"({"num_bits": 8})").strategy, QuantStrategy::kTensor);
  EXPECT_EQ(qa(R"({"group_size": 128})").strategy, QuantStrategy::kGroup);
  EXPECT_EQ(qa(R"({"group_size": -1})").strategy, QuantStrategy::kChannel);
  const QuantArgs a = qa(R"({"num_bits": 8, "type": "FLOAT", "strategy": "BLOCK",
      "block_structure": "128x128", "observer": "minmax", "observer_kwargs": {}, "new_key": 1})");
  EXPECT_EQ(a.type, QuantType::kFloat);
  EXPECT_EQ(a.strategy, QuantStrategy::kBlock);
  EXPECT_EQ(a.block_structure, (std::array<int64_t, 2>{128, 128}));
  EXPECT_EQ(qa(R"({"group_size": 32, "actorder": true})").actorder, ActOrder::kGroup);
  EXPECT_EQ(qa(R"({"group_size": 32, "actorder": "dynamic"})").actorder, ActOrder::kGroup);
  EXPECT_EQ(qa(R"({"group_size": 32, "actorder": "static"})").actorder, ActOrder::kWeight);
  EXPECT_EQ(qa(R"({"actorder": false})").actorder, ActOrder::kNone);
  EXPECT_EQ(qa(R"({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                   "dynamic": "local"})")
                .dynamic,
            DynamicMode::kLocal);
  EXPECT_EQ(qa(R"({"scale_dtype": "uint8", "group_size": 32})").scale_dtype, "torch.uint8");
  EXPECT_FALSE(qa(R"({"zp_dtype": "torch.int8"})").zp_dtype.has_value());  // symmetric
  EXPECT_EQ(qa(R"({"symmetric": false, "zp_dtype": "torch.int8"})").zp_dtype, "torch.int8");
}

TEST(QuantArgs, ValidationRules) {
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "token"})"); }),
              HasSubstr("strategy 'token' requires dynamic quantization"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "group"})"); }),
              HasSubstr("strategy 'group' requires a positive group_size"));
  EXPECT_THAT(
      error_of([] { qa(R"({"strategy": "channel", "group_size": 128})"); }),
      HasSubstr("group_size 128 requires strategy 'group' or 'tensor_group', got 'channel'"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "block"})"); }),
              HasSubstr("strategy 'block' requires block_structure"));
  EXPECT_THAT(error_of([] { qa(R"({"block_structure": [128, 128]})"); }),
              HasSubstr("block_structure requires strategy 'block', got 'tensor'"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "channel", "actorder": "group"})"); }),
              HasSubstr("actorder 'group' requires strategy 'group' or 'tensor_group'"));
  EXPECT_THAT(
      error_of([] { qa(R"({"strategy": "channel", "dynamic": true})"); }),
      HasSubstr("dynamic quantization needs strategy token, tensor, group or tensor_group"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "token", "dynamic": "local"})"); }),
              HasSubstr("dynamic \"local\" is only supported for strategy 'tensor_group'"));
  EXPECT_THAT(error_of([] { qa(R"({"group_size": -2})"); }), HasSubstr("invalid group size -2"));
  EXPECT_THAT(error_of([] { qa(R"({"group_size": 0})"); }), HasSubstr("invalid group size 0"));
  EXPECT_THAT(error_of([] { qa(R"({"type": "float", "num_bits": 6})"); }),
              HasSubstr("float quantization supports 4 or 8 bits, got 6"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "rows"})"); }),
              HasSubstr("unknown strategy 'rows'"));
  EXPECT_THAT(error_of([] { qa(R"({"strategy": "block", "block_structure": "128by128"})"); }),
              HasSubstr("invalid block_structure '128by128'"));
  EXPECT_THAT(error_of([] { qa(R"({"num_bits": "8"})"); }),
              HasSubstr("args: key 'num_bits': expected an integer, got string"));
  EXPECT_THAT(error_of([] { qa(R"({"scale_dtype": "torch.float9"})"); }),
              HasSubstr("unknown torch dtype 'torch.float9'"));
}

// ---------------------------------------------------------------------------------------------
// Presets and scheme mapping

TEST(CompressedTensorsPlan, W8A8Int8Dynamic) {
  const QuantPlan p = plan_of(tiny_llama(), R"({
    "quant_method": "compressed-tensors", "format": "int-quantized",
    "quantization_status": "compressed", "version": "0.10.2",
    "config_groups": {"group_0": {
      "targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                  "dynamic": false, "observer": "minmax"},
      "input_activations": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token",
                            "dynamic": true, "observer": null},
      "output_activations": null}},
    "ignore": ["lm_head"], "kv_cache_scheme": null, "sparsity_config": {}})");
  EXPECT_EQ(p.source(), PlanSource::kCompressedTensors);
  EXPECT_EQ(p.source_file(), "config.json");
  expect_all_linears(p, "w8a8-int8-dyn");
  const PlanEntry& q = p.method_for("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.format, "int-quantized");
  EXPECT_EQ(q.why.source, PlanSource::kCompressedTensors);
  EXPECT_EQ(q.why.group, "group_0");
  EXPECT_EQ(q.why.target, "Linear");
  EXPECT_EQ(q.why.key, "quantization_config.config_groups.group_0.targets[0]");
  ASSERT_TRUE(q.input_activations.has_value());
  EXPECT_EQ(q.input_activations->strategy, QuantStrategy::kToken);
  EXPECT_EQ(q.out_features, 256);
  EXPECT_EQ(q.in_features, 256);
  const PlanEntry& head = p.method_for("lm_head");
  EXPECT_FALSE(head.quantized());
  EXPECT_EQ(head.why.note, "ignored");
  EXPECT_EQ(head.why.target, "lm_head");
  EXPECT_EQ(head.why.key, "quantization_config.ignore[0]");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn"), "kv-bf16");
  EXPECT_EQ(scheme_of(p, "model.layers.0.input_layernorm"), "none");
  EXPECT_TRUE(p.warnings().empty());
}

TEST(CompressedTensorsPlan, PresetGroupNames) {
  const QuantPlan p = plan_of(tiny_llama(), R"({
    "quant_method": "compressed-tensors", "format": "int-quantized",
    "config_groups": {"w8a8": ["Linear"]}, "ignore": ["lm_head"]})");
  expect_all_linears(p, "w8a8-int8-dyn");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.up_proj").source_type, "W8A8");
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "config_groups": {"W3A15": ["Linear"]}})");
              }),
              HasSubstr("key 'quantization_config.config_groups.W3A15': a list of targets needs a "
                        "preset group name, and 'W3A15' is not one (presets: UNQUANTIZED, W8A16"));
  const auto presets = compressed_tensors_presets();
  for (const char* name : {"W4A16", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4", "NVFP4A16", "MXFP4",
                           "MXFP4A16", "MXFP8", "MXFP8A16", "INT8", "W4AFP8"})
    EXPECT_NE(std::find(presets.begin(), presets.end(), name), presets.end()) << name;
}

// compressed-tensors' W4A8 (int8 per-token inputs) and W4AFP8 (fp8 per-token inputs) on int4
// group-128 weights: int-quantized or pack-quantized codes; what no engine reads is refused.
// transform_config: offline transforms (weight_input / weight_output) were fused into the
// stored weights by compressed-tensors and are planned with a warning saying so; an online one
// (a run-time rotation) goes on the linears it targets (test_online_transforms.cpp has the
// rest); training-time parametrizations are refused by name.
TEST(CompressedTensorsPlan, TransformsFusedIntoTheWeightsAreReadOnlineOnesPlanned) {
  auto with = [](const std::string& apply, const char* extra = "") {
    return std::string(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
        "ignore": ["lm_head"], "config_groups": {"W4A16": ["Linear"]},
        "transform_config": {"config_groups": {"R1": {"type": "hadamard", )") +
           extra + R"("apply": [)" + apply + "]}}}}";
  };
  const std::string offline =
      R"({"targets": ["re:.*down_proj$"], "location": "weight_output"},
         {"targets": ["re:.*up_proj$"], "location": "weight_input", "inverse": true})";
  const QuantPlan p = plan_of(tiny_llama(), with(offline).c_str());
  expect_all_linears(p, "ct-w4a16-g128");
  bool warned = false;
  for (const std::string& w : p.warnings())
    warned = warned || w.find("R1' (hadamard): offline locations only") != std::string::npos;
  EXPECT_TRUE(warned);
  for (const PlanEntry& e : p)
    EXPECT_TRUE(e.transforms.empty()) << e.prefix;
  const QuantPlan online =
      plan_of(tiny_llama(),
              with(offline + R"(, {"targets": ["re:.*down_proj$"], "location": "input"})").c_str());
  const PlanEntry& down = online.method_for("model.layers.0.mlp.down_proj");
  ASSERT_EQ(down.transforms.size(), 1u);
  EXPECT_EQ(down.transforms[0].stem(), "R1_input");
  EXPECT_EQ(down.transforms[0].size, 512);
  EXPECT_THAT(down.transforms[0].key, HasSubstr("transform_config.config_groups.R1.apply[2]"));
  EXPECT_THAT(
      error_of([&] { plan_of(tiny_llama(), with(offline, R"("requires_grad": true, )").c_str()); }),
      HasSubstr("requires_grad': true: a training-time parametrization"));
  EXPECT_THAT(error_of([&] {
                plan_of(tiny_llama(),
                        with(R"({"targets": ["Linear"], "location": "weights"})").c_str());
              }),
              HasSubstr("unknown location 'weights'"));
}

TEST(CompressedTensorsPlan, IntWeightsWithPerTokenInputs) {
  auto plan = [](const std::string& group, const char* format) {
    return plan_of(tiny_llama(), (std::string(R"({"quant_method": "compressed-tensors",
        "format": ")") + format + R"(", "ignore": ["lm_head"], "config_groups": )" +
                                  group + "}")
                                     .c_str());
  };
  const QuantPlan a8 = plan(R"({"W4A8": ["Linear"]})", "int-quantized");
  expect_all_linears(a8, "ct-w4a8-g128");
  EXPECT_EQ(a8.method_for("model.layers.0.mlp.down_proj").format, "int-quantized");
  const QuantPlan fp8 = plan(R"({"W4AFP8": ["Linear"]})", "pack-quantized");
  expect_all_linears(fp8, "ct-w4afp8-g128");
  expect_all_linears(plan(R"({"W6A8": ["Linear"]})", "int-quantized"), "ct-w6a8-g128");
  EXPECT_THAT(error_of([&] { plan(R"({"W4A8": ["Linear"]})", "float-quantized"); }),
              HasSubstr("W4A8 integer weights requires format int-quantized, got "
                        "'float-quantized'"));
  EXPECT_THAT(error_of([&] {
                plan(R"({"group_0": {"targets": ["Linear"],
                       "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                   "group_size": 128},
                       "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                             "dynamic": true, "symmetric": false}}})",
                     "int-quantized");
              }),
              HasSubstr("need symmetric dynamic per-token 8-bit inputs"));
}

TEST(CompressedTensorsPlan, W4A16Group32) {
  const QuantPlan p = plan_of(tiny_llama(), R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                  "group_size": 32, "actorder": "weight"}}},
    "ignore": ["lm_head"]})");
  expect_all_linears(p, "w4a16-g32");
  EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").format, "pack-quantized");
}

// compressed-tensors' integer weight-only space, not one preset: every point is planned as the
// kPackedInt scheme of its own args (the refusals of group 128, asym and int8 that main had are
// the bug this guards against).
TEST(CompressedTensorsPlan, IntWeightOnlyPointsOfTheSpace) {
  auto scheme_for = [](const std::string& groups, const char* format = "pack-quantized") {
    const QuantPlan p = plan_of(tiny_llama(), (std::string(R"({"quant_method": "compressed-tensors",
        "format": ")") + format + R"(", "ignore": ["lm_head"], "config_groups": )" +
                                               groups + "}")
                                                  .c_str());
    const std::string s = scheme_of(p, "model.layers.0.mlp.down_proj");
    for (const char* l : kLinears)
      EXPECT_EQ(scheme_of(p, l), s) << l;
    EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").format, "pack-quantized");
    return s;
  };
  // The presets, by name (their args as PRESET_SCHEMES spells them).
  EXPECT_EQ(scheme_for(R"({"W4A16": ["Linear"]})"), "ct-w4a16-g128");
  EXPECT_EQ(scheme_for(R"({"W4A16_ASYM": ["Linear"]})"), "ct-w4a16-g128-asym");
  EXPECT_EQ(scheme_for(R"({"W8A16": ["Linear"]})"), "ct-w8a16-g128");
  // A RedHatAI W4A16 checkpoint's config group, verbatim (observer fields and all).
  EXPECT_EQ(scheme_for(R"({"group_0": {"input_activations": null, "output_activations": null,
      "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null,
      "dynamic": false, "group_size": 128, "num_bits": 4, "observer": "minmax",
      "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}})"),
            "ct-w4a16-g128");
  auto point = [&](const char* weights) {
    return scheme_for(std::string(R"({"g": {"targets": ["Linear"], "weights": )") + weights + "}}");
  };
  EXPECT_EQ(point(R"({"num_bits": 8, "type": "int", "strategy": "channel"})"), "ct-w8a16-ch");
  EXPECT_EQ(point(R"({"num_bits": 3, "strategy": "channel", "symmetric": false})"),
            "ct-w3a16-ch-asym");
  EXPECT_EQ(point(R"({"num_bits": 2, "strategy": "tensor"})"), "ct-w2a16-tensor");
  EXPECT_EQ(point(R"({"num_bits": 4, "strategy": "group", "group_size": 64,
                      "actorder": "group"})"),
            "ct-w4a16-g64-actorder");
  // actorder "weight" changes the calibration order only: the same point as none.
  EXPECT_EQ(point(R"({"num_bits": 4, "group_size": 32, "actorder": "weight"})"), "w4a16-g32");
  const QuantPlan asym = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "pack-quantized", "config_groups": {"W4A16_ASYM": ["Linear"]}})");
  const PlanEntry& e = asym.method_for("model.layers.1.self_attn.q_proj");
  ASSERT_TRUE(e.weights.has_value());
  EXPECT_FALSE(e.weights->symmetric);
  EXPECT_EQ(e.weights->effective_group_size(), 128);
  EXPECT_FALSE(e.input_activations.has_value());

  // What the space does not hold is refused naming the module and the rule.
  EXPECT_THAT(error_of([&] { point(R"({"num_bits": 4, "group_size": 96})"); }),
              HasSubstr("model.layers.0.self_attn.q_proj: ct-w4a16-g96 needs in_features (K = 256) "
                        "divisible by 96"));
  EXPECT_THAT(error_of([&] { point(R"({"num_bits": 1, "strategy": "channel"})"); }),
              HasSubstr("num_bits"));
  EXPECT_THAT(error_of([&] { scheme_for(R"({"W4A16": ["Linear"]})", "int-quantized"); }),
              HasSubstr("model.layers.0.self_attn.q_proj: W4A16 integer weights requires format "
                        "pack-quantized, got 'int-quantized'"));
}

TEST(CompressedTensorsPlan, Fp8Presets) {
  const QuantPlan t = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8": ["Linear"]}, "ignore": ["lm_head"]})");
  expect_all_linears(t, "fp8-tensor");
  const PlanEntry& e = t.method_for("model.layers.0.mlp.up_proj");
  ASSERT_TRUE(e.input_activations.has_value());
  EXPECT_FALSE(e.input_activations->is_dynamic());  // static input_scale

  const QuantPlan c = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8_DYNAMIC": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(c, "fp8-channel");

  const QuantPlan b = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8_BLOCK": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(b, "fp8-block");
  EXPECT_EQ(b.method_for("model.layers.0.mlp.down_proj").weights->block_structure,
            (std::array<int64_t, 2>{128, 128}));

  // Weight-only FP8 (no input activations: vLLM's CompressedTensorsW8A16Fp8) is its own point
  // per strategy, fp8-<tensor|channel|block>-a16, whose id implies no inputs.
  for (const auto& [strategy, id] :
       {std::pair<std::string, std::string>{R"("strategy": "channel")", "fp8-channel-a16"},
        {R"("strategy": "tensor")", "fp8-tensor-a16"},
        {R"("strategy": "block", "block_structure": [128, 128])", "fp8-block-a16"}}) {
    const QuantPlan w = plan_of(tiny_llama(), (R"({"quant_method": "compressed-tensors",
        "format": "float-quantized", "config_groups": {"g": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", )" +
                                               strategy + R"(}}}, "ignore": ["lm_head"]})")
                                                  .c_str());
    if (id == "fp8-block-a16") {
      // fp8 block's 128-row tiles: the tiny model's linears all take it.
      EXPECT_EQ(scheme_of(w, "model.layers.0.mlp.up_proj"), id);
    } else {
      expect_all_linears(w, id);
    }
    EXPECT_FALSE(w.method_for("model.layers.0.mlp.up_proj").input_activations.has_value());
    EXPECT_FALSE(implied_args(parse_scheme_id(id)).input_activations.has_value()) << id;
    EXPECT_EQ(to_string(parse_scheme_id(id)), id);
  }
}

TEST(CompressedTensorsPlan, Fp8Constraints) {
  auto err = [](const char* groups) {
    return error_of([&] {
      plan_of(tiny_llama(), (std::string(R"({"quant_method": "compressed-tensors",
          "format": "float-quantized", "ignore": ["lm_head"], "config_groups": )") +
                             groups + "}")
                                .c_str());
    });
  };
  EXPECT_EQ(err(R"({"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [64, 64]},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                            "dynamic": true}}})"),
            "model.layers.0.self_attn.q_proj: FP8 block weights require block_structure [128, "
            "128], got [64, 64]");
  EXPECT_THAT(err(R"({"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"}}})"),
              HasSubstr("model.layers.0.self_attn.q_proj: FP8 block weights do not support static "
                        "input activations"));
  EXPECT_THAT(err(R"({"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
      "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"}}})"),
              HasSubstr("FP8 channel weights need dynamic per-token input activations or none"));
  EXPECT_THAT(err(R"({"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
      "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": true}}})"),
              HasSubstr("float weights with int input activations"));
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "pack-quantized", "config_groups": {"FP8": ["Linear"]}})");
              }),
              HasSubstr("FP8 requires format float-quantized, got 'pack-quantized'"));
}

TEST(CompressedTensorsPlan, Nvfp4AndNvfp4A16) {
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "nvfp4-pack-quantized", "config_groups": {"NVFP4": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(p, "nvfp4");
  EXPECT_EQ(p.method_for("model.layers.0.mlp.up_proj").input_activations->dynamic,
            DynamicMode::kLocal);
  const QuantPlan w = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "nvfp4-pack-quantized", "config_groups": {"NVFP4A16": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(w, "nvfp4a16");  // the weight-only point
  EXPECT_FALSE(w.method_for("model.layers.0.mlp.up_proj").input_activations.has_value());
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "nvfp4-pack-quantized", "config_groups": {"g": {"targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                "group_size": 32}}}})");
              }),
              HasSubstr("model.layers.0.self_attn.q_proj: NVFP4 requires group_size 16, got 32"));
}

TEST(CompressedTensorsPlan, MxFormats) {
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "mxfp4-pack-quantized", "config_groups": {"MXFP4": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(p, "mxfp4");
  const QuantPlan a16 = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "mxfp4-pack-quantized", "config_groups": {"MXFP4A16": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(a16, "mxfp4a16");
  const QuantPlan p8 = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "mxfp8-quantized", "config_groups": {"MXFP8": ["Linear"]},
      "ignore": ["lm_head"]})");
  expect_all_linears(p8, "mxfp8");
  EXPECT_EQ(error_of([] {
              plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                  "format": "mxfp4-pack-quantized", "config_groups": {"g": {"targets": ["Linear"],
                  "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                              "group_size": 32}}}})");
            }),
            "model.layers.0.self_attn.q_proj: MXFP4 requires scale_dtype torch.uint8 (E8M0 "
            "scales), got none");
}

// ---------------------------------------------------------------------------------------------
// Targets and ignore

TEST(CompressedTensorsPlan, RegexTargetsUseReMatchSemantics) {
  // Anchored at the start: matches every module whose name *starts* with the pattern.
  EXPECT_TRUE(ct_name_matches("re:model.layers.0.mlp", "model.layers.0.mlp.down_proj", "t"));
  EXPECT_TRUE(ct_name_matches("re:.*self_attn\\.q_proj", "model.layers.1.self_attn.q_proj", "t"));
  EXPECT_TRUE(ct_name_matches("re:.*mlp.gate$", "model.layers.0.mlp.gate", "t"));
  EXPECT_FALSE(ct_name_matches("re:.*mlp.gate$", "model.layers.0.mlp.gate_proj", "t"));
  // Not a search: a pattern that only matches mid-string does not match.
  EXPECT_FALSE(ct_name_matches("re:self_attn.q_proj", "model.layers.1.self_attn.q_proj", "t"));
  EXPECT_FALSE(ct_name_matches("re:layers", "model.layers.1.self_attn.q_proj", "t"));
  // Python syntax: \A, named groups.
  EXPECT_TRUE(ct_name_matches("re:\\Amodel\\.layers\\.(?P<i>[0-9]+)\\.mlp",
                              "model.layers.12.mlp.up_proj", "t"));
  // Non-regex targets are exact names.
  EXPECT_TRUE(ct_name_matches("lm_head", "lm_head", "t"));
  EXPECT_FALSE(ct_name_matches("model.layers.0.mlp", "model.layers.0.mlp.up_proj", "t"));

  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8_DYNAMIC": ["re:model.layers.0.mlp"]}})");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.gate_proj"), "fp8-channel");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.down_proj"), "fp8-channel");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.q_proj"), "bf16");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.gate_proj"), "bf16");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.gate_proj").why.note,
            "not matched by any config group");
}

TEST(CompressedTensorsPlan, MidStringRegexMatchesNothingAndIsAnError) {
  EXPECT_EQ(error_of([] {
              plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                  "format": "float-quantized",
                  "config_groups": {"group_0": {"targets": ["re:self_attn.q_proj"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}})");
            }),
            "config.json: key 'quantization_config.config_groups.group_0.targets[0]': target "
            "'re:self_attn.q_proj' of config group 'group_0' matches no module of the model");
  EXPECT_EQ(error_of([] {
              plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                  "format": "float-quantized",
                  "config_groups": {"FP8": ["Linear", "model.layers.7.mlp.down_proj"]}})");
            }),
            "config.json: key 'quantization_config.config_groups.FP8.targets[1]': target "
            "'model.layers.7.mlp.down_proj' of config group 'FP8' matches no module of the model");
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "float-quantized",
                    "config_groups": {"FP8": ["re:.*self_attn$"]}})");
              }),
              HasSubstr("target 're:.*self_attn$' of config group 'FP8' matches no Linear module, "
                        "only model.layers.0.self_attn (LlamaAttention)"));
}

TEST(CompressedTensorsPlan, NestedQuantifiersStayFast) {
  // Exponential for a backtracking matcher on a 30-character name; must return promptly.
  EXPECT_FALSE(ct_name_matches("re:(.*)*(.*)*(.*)*x$", "model.layers.0.self_attn.q_proj", "t"));
  EXPECT_TRUE(ct_name_matches("re:(m|mo)*del", "model.layers.0.self_attn.q_proj", "t"));
}

TEST(CompressedTensorsPlan, InvalidRegexNamesThePattern) {
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "float-quantized", "config_groups": {"FP8": ["re:.*(mlp"]}})");
              }),
              HasSubstr("key 'quantization_config.config_groups.FP8.targets[0]': invalid regex "
                        "'.*(mlp' in target 're:.*(mlp'"));
}

TEST(CompressedTensorsPlan, IgnoreWinsOverTargets) {
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized",
      "config_groups": {"FP8_DYNAMIC": ["Linear", "model.layers.1.mlp.down_proj"]},
      "ignore": ["lm_head", "re:.*down_proj$", "re:.*visual.*", "model.embed_tokens"]})");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.up_proj"), "fp8-channel");
  // Ignored even though an exact-name target names it.
  const PlanEntry& d = p.method_for("model.layers.1.mlp.down_proj");
  EXPECT_EQ(d.scheme_string(), "bf16");
  EXPECT_EQ(d.why.target, "re:.*down_proj$");
  EXPECT_EQ(d.why.key, "quantization_config.ignore[1]");
  // An ignore entry naming nothing is only a warning (real checkpoints carry such entries); one
  // naming a non-Linear module is fine.
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_EQ(p.warnings()[0],
            "config.json: key 'quantization_config.ignore[2]': 're:.*visual.*' matches no module "
            "of the model");
}

// An image-text checkpoint's ignore list names its vision tower module by module (Qwen3.5's
// published configs list every block's linears and the mergers'): those are the tower's, which
// the reference does not run, not names that "match no module"; a name under no module at all
// still warns.
TEST(CompressedTensorsPlan, VisionTowerIgnoreEntriesAreTheTowers) {
  Json j = Json::parse(R"({"architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl", "text_config": {"head_dim": 32, "hidden_size": 64,
      "intermediate_size": 128, "max_position_embeddings": 4096, "model_type": "qwen3_vl_text",
      "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
      "rms_norm_eps": 1e-06, "rope_scaling": {"mrope_interleaved": true,
      "mrope_section": [6, 5, 5], "rope_type": "default"}, "rope_theta": 5000000,
      "tie_word_embeddings": true, "vocab_size": 256, "torch_dtype": "bfloat16"},
    "tie_word_embeddings": true, "image_token_id": 250, "video_token_id": 251,
    "vision_start_token_id": 252, "vision_end_token_id": 253,
    "vision_config": {"deepstack_visual_indexes": [0], "depth": 2, "hidden_size": 32,
      "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64, "patch_size": 4,
      "spatial_merge_size": 2, "temporal_patch_size": 2, "model_type": "qwen3_vl",
      "hidden_act": "gelu_pytorch_tanh", "num_position_embeddings": 64}})");
  const ModelConfig cfg = parse_model_config(j, "config.json");
  ASSERT_TRUE(cfg.image_text);
  const QuantPlan p = plan_of(cfg, R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8_DYNAMIC": ["Linear"]},
      "ignore": ["lm_head", "model.visual.blocks.1.attn.proj", "model.visual.blocks.0.mlp.linear_fc2",
                 "model.visual.merger.linear_fc2", "model.visual.deepstack_merger_list.0.linear_fc1",
                 "re:model\\.visual\\.blocks\\..*", "model.vision_tower.blocks.0.qkv"]})");
  ASSERT_EQ(p.warnings().size(), 1u) << p.warnings().front();
  EXPECT_THAT(p.warnings()[0], HasSubstr("ignore[6]': 'model.vision_tower.blocks.0.qkv' matches "
                                         "no module of the model"));
}

TEST(CompressedTensorsPlan, ExactNameBeatsRegexBeatsClass) {
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "mixed-precision",
      "config_groups": {
        "a_class": {"targets": ["Linear"], "format": "float-quantized",
          "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
          "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}},
        "b_regex": {"targets": ["re:.*down_proj"], "format": "float-quantized",
          "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
          "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"}},
        "c_name": {"targets": ["model.layers.1.mlp.down_proj"], "format": "pack-quantized",
          "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}},
      "ignore": ["lm_head"]})");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.up_proj"), "fp8-channel");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.down_proj"), "fp8-tensor");
  EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").why.group, "b_regex");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.down_proj"), "w4a16-g32");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.down_proj").format, "pack-quantized");
  EXPECT_EQ(p.method_for("model.layers.1.mlp.down_proj").why.target,
            "model.layers.1.mlp.down_proj");
}

TEST(CompressedTensorsPlan, EquallySpecificTargetsWithDifferentSchemesAreAmbiguous) {
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "float-quantized",
                    "config_groups": {"FP8": ["re:.*mlp.*"], "FP8_DYNAMIC": ["re:.*proj"]},
                    "ignore": ["lm_head"]})");
              }),
              HasSubstr("model.layers.0.mlp.gate_proj: matched by target"));
}

TEST(CompressedTensorsPlan, FormatRules) {
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "mixed-precision", "config_groups": {"FP8": ["Linear"]}})");
              }),
              HasSubstr("key 'quantization_config.config_groups.FP8': the top-level format is "
                        "mixed-precision but this group has no format"));
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "packed", "config_groups": {"FP8": ["Linear"]}})");
              }),
              HasSubstr("key 'quantization_config.format': unknown format 'packed'"));
  // A "frozen" checkpoint of a compressed format (the transformers docs' FP8 example, written by
  // compressed-tensors <= 0.5): planned by its format, with a warning; main refused it.
  const QuantPlan frozen = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "naive-quantized", "quantization_status": "frozen", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": {"num_bits": 8,
        "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false},
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true,
        "dynamic": false}}}})");
  expect_all_linears(frozen, "fp8-tensor");
  EXPECT_EQ(frozen.method_for("model.layers.0.mlp.up_proj").format, "naive-quantized");
  EXPECT_THAT(frozen.warnings(),
              testing::Contains(HasSubstr("key 'quantization_config.quantization_status': "
                                          "'frozen': the weights are read as their format")));
  // "frozen" with format dense stores fake-quantized weights: refused by its format, per module.
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "dense", "quantization_status": "frozen",
                    "config_groups": {"FP8": ["Linear"]}})");
              }),
              HasSubstr("format 'dense' stores unquantized (fake-quantized) weights"));
  // No format at all: inferred as compressed-tensors does (FP8 -> float-quantized).
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "config_groups": {"FP8_DYNAMIC": ["Linear"]}, "ignore": ["lm_head"]})");
  EXPECT_EQ(p.method_for("model.layers.0.mlp.up_proj").format, "float-quantized");
  // INT8 W8A8 with static per-tensor inputs (no "dynamic" key: static, symmetric by default),
  // a point of the INT8 space; asymmetric inputs keep their zero point; asymmetric dynamic
  // per-token inputs are refused naming the rule.
  const QuantPlan st = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "int-quantized", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "strategy": "channel"},
      "input_activations": {"num_bits": 8, "strategy": "tensor"}}}, "ignore": ["lm_head"]})");
  EXPECT_EQ(scheme_of(st, "model.layers.0.mlp.up_proj"), "ct-w8a8-int8-static");
  EXPECT_FALSE(st.method_for("model.layers.0.mlp.up_proj").input_activations->is_dynamic());
  const QuantPlan sta = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "naive-quantized", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "strategy": "tensor"},
      "input_activations": {"num_bits": 8, "strategy": "tensor", "symmetric": false}}},
      "ignore": ["lm_head"]})");
  EXPECT_EQ(scheme_of(sta, "model.layers.0.self_attn.k_proj"), "ct-w8a8-int8-wtensor-static-asym");
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "int-quantized", "config_groups": {"g": {"targets": ["Linear"],
                    "weights": {"num_bits": 8, "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "strategy": "token", "dynamic": true,
                                          "symmetric": false}}}})");
              }),
              HasSubstr("asymmetric dynamic per-token inputs is not implemented"));
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "format": "float-quantized", "config_groups": {"FP8": ["Linear"]},
                    "transform_config": {"config_groups": {"R1": {}}}})");
              }),
              HasSubstr("transform_config.config_groups.R1': missing required key 'apply'"));
}

TEST(CompressedTensorsPlan, KvCacheScheme) {
  const QuantPlan p = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "float-quantized", "config_groups": {"FP8": ["Linear"]}, "ignore": ["lm_head"],
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false,
                          "symmetric": true}})");
  for (const char* a : {"model.layers.0.self_attn", "model.layers.1.self_attn"}) {
    const PlanEntry& e = p.method_for(a);
    EXPECT_EQ(e.role, ModuleRole::kKvCache);
    EXPECT_EQ(e.scheme_string(), "kv-fp8");
    ASSERT_TRUE(e.kv_cache.has_value());
    EXPECT_EQ(e.why.key, "quantization_config.kv_cache_scheme");
  }
  // A KV-cache-only config (format dense, no quantized weights) is fine.
  const QuantPlan kv_only = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "format": "dense", "config_groups": {},
      "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}})");
  EXPECT_EQ(scheme_of(kv_only, "model.layers.1.self_attn"), "kv-fp8");
  EXPECT_EQ(scheme_of(kv_only, "model.layers.1.self_attn.q_proj"), "bf16");

  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "config_groups": {}, "kv_cache_scheme": {"num_bits": 8, "type": "int"}})");
              }),
              HasSubstr("key 'quantization_config.kv_cache_scheme': only an FP8 KV cache"));
  // Per-head scales (strategy attn_head, as vLLM reads them): the kv-fp8-head point.
  const QuantPlan per_head = plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
      "config_groups": {}, "kv_cache_scheme": {"num_bits": 8, "type": "float",
      "strategy": "attn_head", "symmetric": true, "dynamic": false}})");
  EXPECT_EQ(scheme_of(per_head, "model.layers.0.self_attn"), "kv-fp8-head");
  EXPECT_TRUE(parse_scheme_id("kv-fp8-head").kv_per_head);
  EXPECT_EQ(implied_args(parse_scheme_id("kv-fp8-head")).kv_cache->strategy,
            QuantStrategy::kAttnHead);
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "compressed-tensors",
                    "config_groups": {}, "kv_cache_scheme": {"num_bits": 8, "type": "float",
                    "strategy": "channel"}})");
              }),
              HasSubstr("kv-fp8 requires strategy tensor or attn_head (vLLM's two), got channel"));
}

// ---------------------------------------------------------------------------------------------
// MoE expert stacks

const char* const kMoeIgnore = R"("ignore": ["lm_head", "re:.*mlp.gate$"])";

std::string moe_qc(const std::string& groups, const std::string& extra = kMoeIgnore) {
  return R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
             "config_groups": )" +
         groups + ", " + extra + "}";
}

TEST(CompressedTensorsPlan, Int4Group32IsMxint4OnExpertStacks) {
  const QuantPlan p = plan_from_quantization_config(
      tiny_qwen3_moe(), Json::parse(moe_qc(R"({"group_0": {"targets": ["Linear"],
          "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}})")),
      "config.json");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.q_proj"), "w4a16-g32");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.gate"), "bf16");  // router ignored
  const PlanEntry& stack = p.method_for("model.layers.0.mlp.experts");
  EXPECT_EQ(stack.role, ModuleRole::kExpertStack);
  EXPECT_EQ(stack.scheme_string(), "mxint4");
  EXPECT_EQ(stack.format, "pack-quantized");
  const PlanEntry& w2 = p.method_for("model.layers.0.mlp.experts.3.down_proj");
  EXPECT_EQ(w2.scheme_string(), "mxint4");
  EXPECT_EQ(w2.stack, "model.layers.0.mlp.experts");
  EXPECT_EQ(w2.expert, 3);
  EXPECT_EQ(w2.shard, ExpertShard::kW2);
  EXPECT_EQ(w2.out_features, 256);
  EXPECT_EQ(w2.in_features, 128);
  // Layer 1 is in mlp_only_layers: a dense MLP, so plain linears.
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.gate_proj"), "w4a16-g32");
  EXPECT_EQ(p.find("model.layers.1.mlp.experts"), nullptr);
}

TEST(CompressedTensorsPlan, Mxint4RejectsActorder) {
  EXPECT_EQ(error_of([] {
              plan_from_quantization_config(
                  tiny_qwen3_moe(), Json::parse(moe_qc(R"({"group_0": {"targets": ["Linear"],
                      "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                  "group_size": 32, "actorder": "weight"}}})")),
                  "config.json");
            }),
            "model.layers.0.mlp.experts.0.gate_proj: mxint4 (W4A16 group 32 on MoE experts) "
            "requires no actorder, got 'weight'");
}

TEST(CompressedTensorsPlan, MixedExpertSchemesAreAnError) {
  EXPECT_EQ(error_of([] {
              plan_from_quantization_config(
                  tiny_qwen3_moe(),
                  Json::parse(moe_qc(R"({"group_0": {"targets": ["Linear"], "weights": {
                      "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}})",
                                     R"("ignore": ["lm_head", "re:.*mlp.gate$",
                                                   "model.layers.0.mlp.experts.2.up_proj"])")),
                  "config.json");
            }),
            "model.layers.0.mlp.experts: all experts and their gate/up/down projections must "
            "share one quantization scheme (engines fuse them into one stack), but "
            "model.layers.0.mlp.experts.0.gate_proj is mxint4 [weights int4 group(32) sym static] "
            "and model.layers.0.mlp.experts.2.up_proj is bf16");
}

TEST(CompressedTensorsPlan, QuantizedRouterIsAnError) {
  EXPECT_THAT(error_of([] {
                plan_from_quantization_config(tiny_qwen3_moe(),
                                              Json::parse(R"({"quant_method": "compressed-tensors",
                        "format": "float-quantized", "config_groups": {"FP8_DYNAMIC": ["Linear"]},
                        "ignore": ["lm_head"]})"),
                                              "config.json");
              }),
              HasSubstr("model.layers.0.mlp.gate: the MoE router is never quantized"));
}

TEST(CompressedTensorsPlan, Fp8BlockOnMoe) {
  const QuantPlan p = plan_from_quantization_config(
      tiny_qwen3_moe(),
      Json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"FP8_BLOCK": ["Linear"]}, "ignore": ["lm_head", "re:.*mlp.gate$"]})"),
      "config.json");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts"), "fp8-block");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts.1.up_proj"), "fp8-block");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.down_proj"), "fp8-block");
  const auto summary = p.summary();
  EXPECT_EQ(summary.at("fp8-block"),
            2 * 4 + 4 * 3 + 1 + 3);  // attention, experts, stack, dense MLP
}

TEST(CompressedTensorsPlan, TiedLmHeadCannotBeQuantized) {
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(/*tied=*/true), R"({"quant_method": "compressed-tensors",
                    "format": "float-quantized", "config_groups": {"FP8_DYNAMIC": ["Linear"]}})");
              }),
              HasSubstr("lm_head: tie_word_embeddings is true"));
}

// ---------------------------------------------------------------------------------------------
// quant_method fp8 and other methods

TEST(Fp8ConfigPlan, BlockAndTensor) {
  const QuantPlan b = plan_from_quantization_config(
      tiny_qwen3_moe(),
      Json::parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["model.layers.1.mlp"]})"),
      "config.json");
  EXPECT_EQ(b.source(), PlanSource::kFp8);
  EXPECT_EQ(scheme_of(b, "model.layers.0.self_attn.q_proj"), "fp8-block");
  EXPECT_EQ(scheme_of(b, "model.layers.0.mlp.experts"), "fp8-block");
  EXPECT_EQ(b.method_for("model.layers.0.mlp.experts.0.up_proj").format, "fp8");
  EXPECT_EQ(scheme_of(b, "model.layers.0.mlp.gate"), "bf16");  // routers never converted
  EXPECT_EQ(scheme_of(b, "lm_head"), "bf16");
  const PlanEntry& skipped = b.method_for("model.layers.1.mlp.up_proj");
  EXPECT_EQ(skipped.scheme_string(), "bf16");
  EXPECT_EQ(skipped.why.target, "model.layers.1.mlp");
  EXPECT_EQ(skipped.why.key, "quantization_config.modules_to_not_convert[0]");

  const QuantPlan t = plan_of(tiny_llama(), R"({"quant_method": "fp8",
      "activation_scheme": "static", "ignored_layers": ["lm_head", "model.layers.9.mlp"]})");
  expect_all_linears(t, "fp8-tensor");
  EXPECT_FALSE(t.method_for("model.layers.0.mlp.up_proj").input_activations->is_dynamic());
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_THAT(t.warnings()[0], HasSubstr("'model.layers.9.mlp' matches no module"));

  EXPECT_EQ(error_of([] {
              plan_of(tiny_llama(), R"({"quant_method": "fp8", "weight_block_size": [64, 64]})");
            }),
            "config.json: key 'quantization_config.weight_block_size': [64,64] is not implemented "
            "(fp8-block needs [128, 128])");
  EXPECT_THAT(error_of([] {
                plan_of(tiny_llama(), R"({"quant_method": "fp8", "activation_scheme": "static",
                    "weight_block_size": [128, 128]})");
              }),
              HasSubstr("block-wise fp8 needs activation_scheme 'dynamic'"));
}

TEST(QuantizationConfigPlan, OtherMethodsAreRejectedByName) {
  EXPECT_EQ(error_of([] { plan_of(tiny_llama(), R"({"quant_method": "bitsandbytes"})"); }),
            "config.json: key 'quantization_config.quant_method': 'bitsandbytes' is not "
            "supported (supported: compressed-tensors, fp8, gptq, awq, modelopt, mxfp4)");
  EXPECT_EQ(error_of([] { plan_of(tiny_llama(), R"({"bits": 4})"); }),
            "config.json: key 'quantization_config': missing required key 'quant_method'");
}

TEST(QuantPlan, OrderLookupAndJson) {
  const QuantPlan p = plan_from_quantization_config(
      tiny_qwen3_moe(),
      Json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"FP8_DYNAMIC": ["Linear"]}, "ignore": ["lm_head", "re:.*mlp.gate$"]})"),
      "config.json");
  std::vector<std::string> first;
  for (const PlanEntry& e : p) {
    first.push_back(e.prefix);
    if (first.size() == 12) break;
  }
  EXPECT_THAT(first,
              ElementsAre("model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj",
                          "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj",
                          "model.layers.0.self_attn", "model.layers.0.self_attn.o_proj",
                          "model.layers.0.post_attention_layernorm", "model.layers.0.mlp.gate",
                          "model.layers.0.mlp.experts", "model.layers.0.mlp.experts.0.gate_proj",
                          "model.layers.0.mlp.experts.0.up_proj",
                          "model.layers.0.mlp.experts.0.down_proj"));
  EXPECT_EQ(p.entries().back().prefix, "lm_head");
  EXPECT_EQ(p.entries()[p.entries().size() - 2].prefix, "model.norm");
  EXPECT_EQ(error_of([&] { p.method_for("model.layers.0.mlp.experts.4.up_proj"); }),
            "model.layers.0.mlp.experts.4.up_proj: no such module in the quantization plan of this "
            "model");
  const Json j = p.to_json();
  EXPECT_EQ(j["source"], "compressed-tensors");
  EXPECT_EQ(j["modules"].size(), p.entries().size());
  const Json& q = j["modules"][1];
  EXPECT_EQ(q["prefix"], "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q["scheme"], "fp8-channel");
  EXPECT_EQ(q["decided_by"]["group"], "FP8_DYNAMIC");
  EXPECT_EQ(q["weights"]["strategy"], "channel");
  EXPECT_EQ(j["modules"][0]["scheme"], nullptr);
}

// hidden 64, intermediate 172 (a real small Llama): K = 172 breaks every group scheme's rule.
ModelConfig odd_llama() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
    "tie_word_embeddings": true})"),
                            "config.json");
}

TEST(OverridePlan, RaggedFp8BlockPlansAndIgnoredLinearsStayUnquantized) {
  // fp8-block tiles may be ragged (scale grid ceil(N/128) x ceil(K/128)): no K rule in the plan.
  const QuantPlan b = plan_from_override(odd_llama(), parse_scheme_id("fp8-block"));
  EXPECT_EQ(scheme_of(b, "model.layers.0.mlp.down_proj"), "fp8-block");
  EXPECT_EQ(required_k_multiple(parse_scheme_id("fp8-block")), 0);
  EXPECT_EQ(required_k_multiple(parse_scheme_id("w8a16-g64")), 64);
  // A group scheme still refuses K = 172, naming the linear and the rule ...
  EXPECT_EQ(error_of([] { plan_from_override(odd_llama(), parse_scheme_id("w4a16-g32")); }),
            "model.layers.0.mlp.down_proj: w4a16-g32 needs in_features (K = 172) divisible by 32");
  // ... unless the linears are left out.
  const QuantPlan w =
      plan_from_override(odd_llama(), parse_scheme_id("w4a16-g32"),
                         {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"});
  for (const char* m : {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}) {
    EXPECT_EQ(scheme_of(w, m), "bf16") << m;
    EXPECT_FALSE(w.method_for(m).quantized());
    EXPECT_THAT(w.method_for(m).why.note, HasSubstr("ignored"));
  }
  EXPECT_EQ(scheme_of(w, "model.layers.0.mlp.up_proj"), "w4a16-g32");
  // An expert stack runs one scheme: one expert left out is refused.
  EXPECT_THAT(error_of([] {
                plan_from_override(tiny_qwen3_moe(), parse_scheme_id("fp8-block"),
                                   {"model.layers.0.mlp.experts.1.down_proj"});
              }),
              HasSubstr("model.layers.0.mlp.experts: all experts"));
}

}  // namespace
}  // namespace qparity
