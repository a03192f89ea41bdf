// msModelSlim quant_model_description.json -> QuantPlan, the --scheme override, and the source
// priority of build_quant_plan (override > description file > config.json > nothing).
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/config/model_config.h"
#include "core/error.h"
#include "schemes/description/module_names.h"
#include "schemes/description/msmodelslim_config.h"
#include "schemes/description/quant_plan.h"

#include "error_of.h"
#include "plan_fixtures.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using test::error_of;

using test::all_but_head;
using test::describe_model;
using test::suffixes_of;
using test::tiny_llama;
using test::tiny_llama_json;
using test::tiny_qwen3_moe;

QuantPlan msm(const ModelConfig& cfg, const Json& d) {
  return plan_from_msmodelslim(cfg, d, "quant_model_description.json");
}

std::string scheme_of(const QuantPlan& p, const std::string& prefix) {
  return p.method_for(prefix).scheme_string();
}

TEST(MsModelSlimPlan, W8A16PerChannel) {
  const ModelConfig cfg = tiny_llama();
  const QuantPlan p =
      msm(cfg, describe_model(
                   cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); }, "W8A16"));
  EXPECT_EQ(p.source(), PlanSource::kMsModelSlim);
  EXPECT_EQ(p.source_file(), "quant_model_description.json");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.q_proj"), "w8a16-ch");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.down_proj"), "w8a16-ch");
  const PlanEntry& e = p.method_for("model.layers.1.mlp.down_proj");
  EXPECT_EQ(e.format, "msmodelslim");
  EXPECT_EQ(e.source_type, "W8A16");
  EXPECT_EQ(e.why.source, PlanSource::kMsModelSlim);
  EXPECT_EQ(e.why.file, "quant_model_description.json");
  EXPECT_EQ(e.why.key, "model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(e.weights.has_value());
  EXPECT_EQ(e.weights->strategy, QuantStrategy::kChannel);
  EXPECT_FALSE(e.input_activations.has_value());
  EXPECT_EQ(scheme_of(p, "lm_head"), "bf16");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn"), "kv-bf16");
  EXPECT_EQ(scheme_of(p, "model.layers.0.input_layernorm"), "none");
  EXPECT_TRUE(p.warnings().empty());
}

TEST(MsModelSlimPlan, W8A16Group128) {
  const ModelConfig cfg = tiny_llama();
  const QuantPlan p = msm(
      cfg, describe_model(
               cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); }, "W8A16", 128));
  const PlanEntry& e = p.method_for("model.layers.0.mlp.down_proj");
  EXPECT_EQ(e.scheme_string(), "w8a16-g128");
  EXPECT_EQ(e.scheme->group_size, 128);
  EXPECT_EQ(e.weights->effective_group_size(), 128);
  // A group that does not divide K is caught here, not in the loader.
  EXPECT_THAT(error_of([&] {
                msm(cfg, describe_model(
                             cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); },
                             "W8A16", 96));
              }),
              HasSubstr("model.layers.0.self_attn.q_proj: w8a16-g96 needs in_features (K = 256) "
                        "divisible by 96"));
}

TEST(MsModelSlimPlan, W8A8WithFloatLmHeadDispatchesPerTensor) {
  const ModelConfig cfg = tiny_llama();
  // model_quant_type says W8A8 but one layer fell back to FLOAT and one is W8A16: the per-tensor
  // types decide.
  const QuantPlan p = msm(cfg, describe_model(
                                   cfg,
                                   [](const LinearModule& l) -> std::string {
                                     if (l.prefix == "model.layers.1.mlp.down_proj") return "FLOAT";
                                     if (l.prefix == "model.layers.1.mlp.up_proj") return "W8A16";
                                     return all_but_head(l, "W8A8");
                                   },
                                   "W8A8"));
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.o_proj"), "w8a8-static");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.down_proj"), "bf16");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.up_proj"), "w8a16-ch");
  EXPECT_EQ(scheme_of(p, "lm_head"), "bf16");
  EXPECT_EQ(p.method_for("lm_head").source_type, "FLOAT");
  const PlanEntry& e = p.method_for("model.layers.0.self_attn.o_proj");
  ASSERT_TRUE(e.input_activations.has_value());
  EXPECT_FALSE(e.input_activations->symmetric);  // asymmetric per-tensor activations
  EXPECT_EQ(e.input_activations->strategy, QuantStrategy::kTensor);
  // gate_proj and up_proj now differ: the plan warns that a fused gate_up_proj cannot take it.
  ASSERT_EQ(p.warnings().size(), 1u);
  EXPECT_THAT(p.warnings()[0], HasSubstr("model.layers.1.mlp.gate_up_proj rejects this"));
}

TEST(MsModelSlimPlan, W8A8SAndDynamicTypes) {
  const ModelConfig cfg = tiny_llama();
  auto plan_for = [&](const std::string& t, int64_t gs = 0) {
    return msm(cfg, describe_model(
                        cfg, [&](const LinearModule& l) { return all_but_head(l, t); }, t, gs));
  };
  EXPECT_EQ(scheme_of(plan_for("W8A8S"), "model.layers.0.mlp.up_proj"), "w8a8s");
  EXPECT_EQ(scheme_of(plan_for("W8A8_DYNAMIC"), "model.layers.0.mlp.up_proj"), "w8a8-int8-dyn");
  EXPECT_EQ(scheme_of(plan_for("WFP8AFP8_DYNAMIC"), "model.layers.0.mlp.up_proj"), "fp8-channel");
  EXPECT_THAT(error_of([&] { plan_for("W8A8_DYNAMIC", 128); }),
              HasSubstr("W8A8_DYNAMIC with group_size 128 (per-group weight scales) is not "
                        "implemented"));
}

// msModelSlim v1 W4A8_DYNAMIC (per channel, version 1.0.0): MoE experts as vllm-ascend runs them
// (dense layers W8A8_DYNAMIC), and dense linears too; the per-group and pre-1.0.0 layouts are
// refused by name.
TEST(MsModelSlimPlan, W4A8DynamicPerChannel) {
  const ModelConfig moe = tiny_qwen3_moe();
  auto mixed = [](const LinearModule& l) -> std::string {
    if (l.kind == LinearKind::kLmHead || l.kind == LinearKind::kRouter) return "FLOAT";
    return l.in_expert_stack() ? "W4A8_DYNAMIC" : "W8A8_DYNAMIC";
  };
  const QuantPlan p = msm(moe, describe_model(moe, mixed, "W8A8_DYNAMIC"));
  EXPECT_TRUE(p.warnings().empty());
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts"), "w4a8-dyn");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts.2.down_proj"), "w4a8-dyn");
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.o_proj"), "w8a8-int8-dyn");
  const PlanEntry& e = p.method_for("model.layers.0.mlp.experts.1.up_proj");
  EXPECT_EQ(e.format, "msmodelslim");
  EXPECT_EQ(e.source_type, "W4A8_DYNAMIC");
  ASSERT_TRUE(e.weights && e.input_activations);
  EXPECT_EQ(e.weights->num_bits, 4);
  EXPECT_EQ(e.weights->strategy, QuantStrategy::kChannel);
  EXPECT_EQ(e.input_activations->strategy, QuantStrategy::kToken);

  const ModelConfig cfg = tiny_llama();
  auto all = [](const LinearModule& l) { return all_but_head(l, "W4A8_DYNAMIC"); };
  EXPECT_EQ(
      scheme_of(msm(cfg, describe_model(cfg, all, "W8A8_DYNAMIC")), "model.layers.1.mlp.down_proj"),
      "w4a8-dyn");
  EXPECT_THAT(error_of([&] { msm(cfg, describe_model(cfg, all, "W8A8_DYNAMIC", 64)); }),
              HasSubstr("key 'model.layers.0.self_attn.q_proj.weight': W4A8_DYNAMIC with "
                        "group_size 64 (the per-group two-level layout) is not implemented by "
                        "the qparity reference"));
  Json second = describe_model(cfg, all, "W8A8_DYNAMIC");
  second["model.layers.0.mlp.up_proj.weight_scale_second"] = "W4A8_DYNAMIC";
  EXPECT_THAT(error_of([&] { msm(cfg, second); }),
              HasSubstr("key 'model.layers.0.mlp.up_proj.weight_scale_second': W4A8_DYNAMIC "
                        "with per-group two-level scales"));
  Json old = describe_model(cfg, all, "W8A8_DYNAMIC");
  old["version"] = "0.0.1";
  EXPECT_THAT(error_of([&] { msm(cfg, old); }),
              HasSubstr("key 'version': '0.0.1' with W4A8_DYNAMIC entries"));
  Json unversioned = describe_model(cfg, all, "W8A8_DYNAMIC");
  unversioned.erase("version");
  const QuantPlan u = msm(cfg, unversioned);
  ASSERT_EQ(u.warnings().size(), 1u);
  EXPECT_THAT(u.warnings()[0], HasSubstr("read as the v1 packed layout"));
  Json no_bias = describe_model(cfg, all, "W8A8_DYNAMIC");
  no_bias.erase("model.layers.1.mlp.gate_proj.scale_bias");
  EXPECT_THAT(error_of([&] { msm(cfg, no_bias); }),
              HasSubstr("missing entry 'model.layers.1.mlp.gate_proj.scale_bias' of a "
                        "W4A8_DYNAMIC linear"));
}

TEST(MsModelSlimPlan, W8A8SCIsRejectedWithItsReason) {
  const ModelConfig cfg = tiny_llama();
  EXPECT_EQ(error_of([&] {
              msm(cfg, describe_model(
                           cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8SC"); },
                           "W8A8SC"));
            }),
            "quant_model_description.json: key 'model.layers.0.self_attn.q_proj.weight': W8A8SC "
            "weights are compressed by msModelSlim's closed native tool (compress_excutor) and "
            "cannot be reproduced; use the uncompressed W8A8S checkpoint instead");
}

TEST(MsModelSlimPlan, OtherTypesAreRejectedByName) {
  const ModelConfig cfg = tiny_llama();
  EXPECT_EQ(error_of([&] {
              msm(cfg,
                  describe_model(
                      cfg, [](const LinearModule& l) { return all_but_head(l, "W4A4_DYNAMIC"); },
                      "W4A4_DYNAMIC"));
            }),
            "quant_model_description.json: key 'model.layers.0.self_attn.q_proj.weight': quant "
            "type 'W4A4_DYNAMIC' is not supported by qparity (supported: FLOAT, W8A16, W8A8, "
            "W8A8S, W8A8_DYNAMIC, WFP8AFP8_DYNAMIC, W4A8_DYNAMIC and C8 KV caches)");
  EXPECT_THAT(error_of([&] {
                msm(cfg, describe_model(
                             cfg,
                             [](const LinearModule& l) {
                               return all_but_head(l, "W4A4_FLATQUANT_DYNAMIC");
                             },
                             "W4A4_DYNAMIC"));
              }),
              HasSubstr("quant type 'W4A4_FLATQUANT_DYNAMIC' is not supported by qparity"));
  EXPECT_THAT(
      error_of([&] {
        msm(cfg, describe_model(
                     cfg, [](const LinearModule& l) { return all_but_head(l, "W9A9"); }, "W9A9"));
      }),
      HasSubstr("unknown msModelSlim quant type 'W9A9'"));
}

TEST(MsModelSlimPlan, C8KvCache) {
  const ModelConfig cfg = tiny_llama();
  Json d = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8"); }, "W8A8");
  for (int i = 0; i < 2; ++i)
    for (const char* proj : {"k_proj", "v_proj"})
      for (const char* t : {"kv_cache_scale", "kv_cache_offset"})
        d["model.layers." + std::to_string(i) + ".self_attn." + proj + "." + t] = "C8";
  d["kv_cache_type"] = "C8";
  d["kv_quant_type"] = "C8";
  const QuantPlan p = msm(cfg, d);
  for (const char* a : {"model.layers.0.self_attn", "model.layers.1.self_attn"}) {
    const PlanEntry& e = p.method_for(a);
    EXPECT_EQ(e.scheme_string(), "kv-int8");
    EXPECT_EQ(e.source_type, "C8");
    ASSERT_TRUE(e.kv_cache.has_value());
    EXPECT_EQ(e.kv_cache->strategy, QuantStrategy::kChannel);
  }
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.k_proj"), "w8a8-static");

  Json missing = d;
  missing.erase("model.layers.1.self_attn.v_proj.kv_cache_offset");
  EXPECT_EQ(error_of([&] { msm(cfg, missing); }),
            "quant_model_description.json: kv_cache_type is C8 but entry "
            "'model.layers.1.self_attn.v_proj.kv_cache_offset' is missing");
  Json wrong = d;
  wrong["model.layers.0.self_attn.q_proj.kv_cache_scale"] = "C8";
  EXPECT_THAT(error_of([&] { msm(cfg, wrong); }),
              HasSubstr("'kv_cache_scale' is not a tensor of this linear (C8 entries sit on "
                        "k_proj and v_proj)"));
}

TEST(MsModelSlimPlan, AntiOutlierNorms) {
  const ModelConfig cfg = tiny_llama();
  Json d = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8"); }, "W8A8");
  d["model.layers.0.input_layernorm.bias"] = "FLOAT";         // new style
  d.erase("model.layers.1.post_attention_layernorm.weight");  // old style
  d["model.layers.1.post_attention_layernorm.module.weight"] = "FLOAT";
  d["model.layers.1.post_attention_layernorm.module.bias"] = "FLOAT";
  const QuantPlan p = msm(cfg, d);
  const PlanEntry& a = p.method_for("model.layers.0.input_layernorm");
  EXPECT_EQ(a.role, ModuleRole::kNorm);
  EXPECT_EQ(a.scheme_string(), "smoothquant");
  EXPECT_EQ(a.why.key, "model.layers.0.input_layernorm.bias");
  const PlanEntry& b = p.method_for("model.layers.1.post_attention_layernorm");
  EXPECT_EQ(b.scheme_string(), "smoothquant");
  EXPECT_THAT(b.why.note, HasSubstr("old-style"));
  EXPECT_EQ(scheme_of(p, "model.layers.0.post_attention_layernorm"), "none");
  EXPECT_FALSE(p.method_for("model.layers.0.post_attention_layernorm").quantized());

  Json nonfused = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8"); }, "W8A8");
  nonfused["model.layers.0.self_attn.o_proj.div.mul_scale"] = "FLOAT";
  EXPECT_THAT(error_of([&] { msm(cfg, nonfused); }),
              HasSubstr("key 'model.layers.0.self_attn.o_proj.div.mul_scale': non-fusable "
                        "anti-outlier smoothing"));
}

TEST(MsModelSlimPlan, EveryModuleNeedsAnEntryAndEveryEntryAModule) {
  const ModelConfig cfg = tiny_llama();
  const Json base = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); }, "W8A16");
  Json missing = base;
  missing.erase("model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(error_of([&] { msm(cfg, missing); }),
            "quant_model_description.json: missing entry 'model.layers.1.mlp.down_proj.weight' "
            "(every module of the model needs one)");
  Json no_norm = base;
  no_norm.erase("model.norm.weight");
  EXPECT_EQ(error_of([&] { msm(cfg, no_norm); }),
            "quant_model_description.json: missing entry 'model.norm.weight' (every module of the "
            "model needs one)");
  Json no_scale = base;
  no_scale.erase("model.layers.0.mlp.up_proj.weight_scale");
  EXPECT_EQ(error_of([&] { msm(cfg, no_scale); }),
            "quant_model_description.json: missing entry 'model.layers.0.mlp.up_proj.weight_scale' "
            "of a W8A16 linear");

  Json extra_layer = base;
  extra_layer["model.layers.2.self_attn.q_proj.weight"] = "W8A16";
  EXPECT_EQ(error_of([&] { msm(cfg, extra_layer); }),
            "quant_model_description.json: key 'model.layers.2.self_attn.q_proj.weight': names no "
            "tensor of a module of this LlamaForCausalLM model");
  Json stray = base;
  stray["vision_tower.patch_embed.weight"] = "FLOAT";
  EXPECT_THAT(error_of([&] { msm(cfg, stray); }),
              HasSubstr("key 'vision_tower.patch_embed.weight': names no tensor"));
  Json wrong_suffix = base;
  wrong_suffix["model.layers.0.mlp.up_proj.input_scale"] = "W8A16";
  EXPECT_EQ(error_of([&] { msm(cfg, wrong_suffix); }),
            "quant_model_description.json: key 'model.layers.0.mlp.up_proj.input_scale': "
            "'input_scale' is not a tensor of a W8A16 linear (expected weight, weight_scale, "
            "weight_offset, bias)");
  Json mismatch = base;
  mismatch["model.layers.0.mlp.up_proj.weight_scale"] = "W8A8";
  EXPECT_THAT(error_of([&] { msm(cfg, mismatch); }),
              HasSubstr("type 'W8A8' differs from the layer's weight type 'W8A16'"));
  Json not_string = base;
  not_string["model.layers.0.mlp.up_proj.weight"] = 8;
  EXPECT_EQ(error_of([&] { msm(cfg, not_string); }),
            "quant_model_description.json: key 'model.layers.0.mlp.up_proj.weight': expected a "
            "quant type string, got integer");
}

TEST(MsModelSlimPlan, UnsupportedGlobalFeatures) {
  const ModelConfig cfg = tiny_llama();
  const Json base = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8"); }, "W8A8");
  Json fa = base;
  fa["fa_quant_type"] = "FAKQuant";
  EXPECT_THAT(error_of([&] { msm(cfg, fa); }),
              HasSubstr("key 'fa_quant_type': 'FAKQuant': quantized attention (FA) is not "
                        "implemented"));
  Json fa_entry = base;
  fa_entry["model.layers.0.self_attn.fa_q.scale"] = "FAQuant";
  EXPECT_THAT(error_of([&] { msm(cfg, fa_entry); }),
              HasSubstr("'FAQuant': quantized attention (FA) is not implemented"));
  Json per_token = base;
  per_token["model.layers.1.self_attn.quant_type"] = "INT8_DYNAMIC";
  EXPECT_EQ(error_of([&] { msm(cfg, per_token); }),
            "quant_model_description.json: key 'model.layers.1.self_attn.quant_type': "
            "'INT8_DYNAMIC': quantized attention (FA) is not implemented by qparity");
  per_token["model.layers.1.self_attn.quant_type"] = "FLOAT";
  EXPECT_EQ(scheme_of(msm(cfg, per_token), "model.layers.1.self_attn"), "kv-bf16");
  Json quarot = base;
  quarot["metadata"] = Json::parse(R"({"quarot": {"heads_rotation": true}})");
  EXPECT_THAT(error_of([&] { msm(cfg, quarot); }), HasSubstr("QuaRot online rotation"));
}

TEST(MsModelSlimPlan, TiedLmHeadNeedsNoEntry) {
  const ModelConfig cfg = tiny_llama(/*tied=*/true);
  Json d = describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); }, "W8A16");
  d.erase("lm_head.weight");
  EXPECT_EQ(scheme_of(msm(cfg, d), "lm_head"), "bf16");
}

TEST(MsModelSlimPlan, MoeExpertStacks) {
  const ModelConfig cfg = tiny_qwen3_moe();
  const QuantPlan p =
      msm(cfg, describe_model(
                   cfg, [](const LinearModule& l) { return all_but_head(l, "W8A8_DYNAMIC"); },
                   "W8A8_DYNAMIC"));
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts"), "w8a8-int8-dyn");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts.2.down_proj"), "w8a8-int8-dyn");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.gate"), "bf16");

  EXPECT_THAT(error_of([&] {
                msm(cfg, describe_model(
                             cfg,
                             [](const LinearModule& l) -> std::string {
                               if (l.prefix == "model.layers.0.mlp.experts.1.down_proj")
                                 return "FLOAT";
                               return all_but_head(l, "W8A8_DYNAMIC");
                             },
                             "W8A8_DYNAMIC"));
              }),
              HasSubstr("model.layers.0.mlp.experts: all experts and their gate/up/down "
                        "projections must share one quantization scheme"));
  EXPECT_THAT(error_of([&] {
                msm(cfg, describe_model(
                             cfg,
                             [](const LinearModule& l) -> std::string {
                               return l.kind == LinearKind::kLmHead ? "FLOAT" : "W8A8_DYNAMIC";
                             },
                             "W8A8_DYNAMIC"));
              }),
              HasSubstr("model.layers.0.mlp.gate: the MoE router is never quantized"));
}

// ---------------------------------------------------------------------------------------------
// Overrides and source priority

TEST(OverridePlan, WeightSchemesSkipLmHeadAndRouters) {
  const QuantPlan p = plan_from_override(tiny_qwen3_moe(), parse_scheme_id("w4a16-g32"));
  EXPECT_EQ(p.source(), PlanSource::kOverride);
  EXPECT_EQ(scheme_of(p, "model.layers.0.self_attn.q_proj"), "w4a16-g32");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts"), "mxint4");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.experts.0.up_proj"), "mxint4");
  EXPECT_EQ(scheme_of(p, "model.layers.1.mlp.up_proj"), "w4a16-g32");
  EXPECT_EQ(scheme_of(p, "model.layers.0.mlp.gate"), "bf16");
  EXPECT_EQ(scheme_of(p, "lm_head"), "bf16");
  EXPECT_EQ(p.method_for("model.layers.0.self_attn.q_proj").why.key, "w4a16-g32");
  EXPECT_EQ(p.method_for("model.layers.0.self_attn.q_proj").why.file, "--scheme");
  // mxint4 on a plain linear is w4a16-g32: the same checkpoint format.
  EXPECT_EQ(scheme_of(plan_from_override(tiny_qwen3_moe(), parse_scheme_id("mxint4")),
                      "model.layers.1.mlp.down_proj"),
            "w4a16-g32");
}

TEST(OverridePlan, KvAndTransformSchemes) {
  const QuantPlan p = plan_from_override(tiny_llama(), parse_scheme_id("kv-fp8"));
  EXPECT_EQ(scheme_of(p, "model.layers.1.self_attn"), "kv-fp8");
  EXPECT_EQ(scheme_of(p, "model.layers.1.self_attn.q_proj"), "bf16");
  EXPECT_THAT(error_of([] { plan_from_override(tiny_llama(), parse_scheme_id("smoothquant")); }),
              HasSubstr("--scheme smoothquant: a norm transform cannot be applied by override"));
  // mxint4 needs a bf16 model (SGLang asserts it); the tiny Llama here is fp16.
  EXPECT_THAT(error_of([] {
                plan_from_override(tiny_qwen3_moe(), parse_scheme_id("fp8-block"));
                plan_from_override(parse_model_config(
                                       [] {
                                         Json j = Json::parse(R"({
                              "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256,
                              "intermediate_size": 512, "moe_intermediate_size": 128,
                              "num_experts": 4, "num_experts_per_tok": 2,
                              "num_attention_heads": 4, "head_dim": 64, "num_hidden_layers": 1,
                              "vocab_size": 1000, "rms_norm_eps": 1e-6, "torch_dtype": "float16"})");
                                         return j;
                                       }(),
                                       "config.json"),
                                   parse_scheme_id("mxint4"));
              }),
              HasSubstr("mxint4 needs a bfloat16 model"));
}

const char* const kCtQc = R"({"quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"FP8_DYNAMIC": ["Linear"]}, "ignore": ["lm_head"]})";

Json w8a16_description(const ModelConfig& cfg) {
  return describe_model(
      cfg, [](const LinearModule& l) { return all_but_head(l, "W8A16"); }, "W8A16");
}

TEST(SourcePriority, OverrideThenDescriptionThenConfig) {
  const ModelConfig cfg = tiny_llama();
  QuantSources all;
  all.override_scheme = "fp8-block";
  all.msmodelslim_description = w8a16_description(cfg);
  all.quantization_config = Json::parse(kCtQc);

  const QuantPlan o = build_quant_plan(cfg, all);
  EXPECT_EQ(o.source(), PlanSource::kOverride);
  EXPECT_EQ(scheme_of(o, "model.layers.0.mlp.up_proj"), "fp8-block");
  EXPECT_EQ(o.method_for("model.layers.0.mlp.up_proj").why.source, PlanSource::kOverride);
  ASSERT_EQ(o.warnings().size(), 1u);
  EXPECT_THAT(o.warnings()[0], HasSubstr("--scheme fp8-block overrides the checkpoint's "
                                         "quant_model_description.json"));

  QuantSources no_override = all;
  no_override.override_scheme.reset();
  const QuantPlan m = build_quant_plan(cfg, no_override);
  EXPECT_EQ(m.source(), PlanSource::kMsModelSlim);
  EXPECT_EQ(scheme_of(m, "model.layers.0.mlp.up_proj"), "w8a16-ch");
  EXPECT_EQ(m.method_for("model.layers.0.mlp.up_proj").why.source, PlanSource::kMsModelSlim);
  ASSERT_EQ(m.warnings().size(), 1u);
  EXPECT_THAT(m.warnings()[0], HasSubstr("config.json quantization_config was not applied"));

  QuantSources config_only = no_override;
  config_only.msmodelslim_description.reset();
  const QuantPlan c = build_quant_plan(cfg, config_only);
  EXPECT_EQ(c.source(), PlanSource::kCompressedTensors);
  EXPECT_EQ(scheme_of(c, "model.layers.0.mlp.up_proj"), "fp8-channel");
  EXPECT_EQ(c.method_for("model.layers.0.mlp.up_proj").why.source, PlanSource::kCompressedTensors);

  const QuantPlan d = build_quant_plan(cfg, QuantSources{});
  EXPECT_EQ(d.source(), PlanSource::kDefault);
  for (const PlanEntry& e : d)
    EXPECT_FALSE(e.quantized()) << e.prefix;
  EXPECT_EQ(d.method_for("lm_head").why.note, "no quantization config in the checkpoint");

  QuantSources bad = all;
  bad.override_scheme = "int3";
  EXPECT_THAT(error_of([&] { build_quant_plan(cfg, bad); }),
              HasSubstr("scheme 'int3': unknown scheme id (valid: bf16,"));
}

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qparity_test_plan_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const Json& j) { std::ofstream(dir_ / name) << j.dump(1); }
  fs::path dir_;
};

TEST_F(CheckpointDir, ReadsTheFilesOfACheckpoint) {
  const ModelConfig cfg = tiny_llama();
  Json config = tiny_llama_json();
  write("config.json", config);
  EXPECT_EQ(build_quant_plan(cfg, dir_, std::nullopt).source(), PlanSource::kDefault);

  config["quantization_config"] = Json::parse(kCtQc);
  write("config.json", config);
  const QuantPlan c = build_quant_plan(cfg, dir_, std::nullopt);
  EXPECT_EQ(c.source(), PlanSource::kCompressedTensors);
  EXPECT_EQ(c.source_file(), (dir_ / "config.json").string());

  // v0 name, next to a config.json that still has a quantization_config.
  write("quant_model_description_w8a16.json", w8a16_description(cfg));
  const QuantPlan v0 = build_quant_plan(cfg, dir_, std::nullopt);
  EXPECT_EQ(v0.source(), PlanSource::kMsModelSlim);
  EXPECT_EQ(v0.source_file(), (dir_ / "quant_model_description_w8a16.json").string());

  write("quant_model_description_w8a8.json", w8a16_description(cfg));
  EXPECT_THAT(error_of([&] { build_quant_plan(cfg, dir_, std::nullopt); }),
              HasSubstr("several msModelSlim descriptions (quant_model_description_w8a16.json, "
                        "quant_model_description_w8a8.json); keep exactly one"));

  // The v1 name wins over v0 files.
  write("quant_model_description.json", w8a16_description(cfg));
  const QuantPlan v1 = build_quant_plan(cfg, dir_, std::nullopt);
  EXPECT_EQ(v1.source_file(), (dir_ / "quant_model_description.json").string());
  EXPECT_EQ(scheme_of(v1, "model.layers.1.self_attn.v_proj"), "w8a16-ch");

  const QuantPlan o = build_quant_plan(cfg, dir_, std::string("w8a8-int8-dyn"));
  EXPECT_EQ(o.source(), PlanSource::kOverride);
  EXPECT_EQ(scheme_of(o, "model.layers.1.self_attn.v_proj"), "w8a8-int8-dyn");
}

}  // namespace
}  // namespace qparity
