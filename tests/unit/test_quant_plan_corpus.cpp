// quantization_config blocks transcribed verbatim from public checkpoints, producer docs and test
// data (tests/data/ct_configs/, each file's source in SOURCES.md there), planned unchanged on a
// model of the checkpoint's kind (a Qwen3-MoE shape for the MoE checkpoints whose architecture
// qparity runs, a Llama shape for dense ones and for architectures it does not run, MLA / DeepSeek
// MoE, whose configs' args are planned all the same): each is planned, or refused naming the
// module and the rule that qparity does not implement yet. The table is the support status; a
// change in either direction fails here until the table says so.
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/json_util.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/quant_plan.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;

ModelConfig model(const std::string& kind) {
  if (kind == "moe")
    return parse_model_config(Json::parse(R"({
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
      "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 4,
      "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 64, "num_hidden_layers": 2, "mlp_only_layers": [1], "vocab_size": 1000,
      "rms_norm_eps": 1e-6, "norm_topk_prob": true, "torch_dtype": "bfloat16"})"),
                              "config.json");
  return parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16"})"),
                            "config.json");
}

struct Expected {
  const char* model;             // "moe" or "dense"
  const char* result;            // "" = planned; otherwise a substring of the refusal
  const char* scheme = nullptr;  // planned: the scheme of model.layers.0.mlp.down_proj
  const char* sparsity = "";     // planned: the sparse storage of that linear's weight
};

// "" = planned; otherwise a substring of the refusal.
const std::map<std::string, Expected> kExpected = {
    {"01-kimi-k2.5-w4a16-int4-g32-moe.json", {"dense", ""}},
    {"02-glm5-w4a16-awq-int4-g64.json", {"dense", ""}},
    {"03-ct-pr169-w4a16-g128-version-0.6.json", {"dense", ""}},
    {"04-tinyllama-w4a16-g128-dense-sparsity.json", {"dense", ""}},
    {"05-llama7b-2of4-w4a16-g128-frozen-legacy.json", {"dense", ""}},
    {"06-laguna-s-fp8-block-kvfp8-moe-ignore.json", {"moe", ""}},
    // An offline Hadamard R1 (transform_config, weight_input / weight_output only): fused into
    // the stored weights by compressed-tensors, so the plan is the fp8-block one.
    {"07-laguna-xs-fp8-block-kvfp8-hadamard-transform.json", {"moe", ""}},
    // DeepSeek-V4's attention modules (fused_wqa_wkv, wq_b, ...): an architecture qparity does
    // not run, so its attention group's regex targets match nothing (the FFN group plans).
    {"08-redhat-deepseek-v4-flash-nvfp4-fp8-mixed.json",
     {"dense", "matches no module of the model"}},
    {"09-kimi-k3-mxfp4-g32.json", {"dense", ""}},
    // 2:4 sparsity alone (no config_groups): every decoder linear stays bf16, its weight stored
    // as sparse-24-bitmask parts; lm_head is in the sparsity ignore list.
    {"10-llama2c-stories42m-sparse-24-bitmask-only.json",
     {"dense", "", "bf16", "sparse-24-bitmask"}},
    {"11-tinyllama-fp8-static-tensor-legacy-actorder-false.json", {"dense", ""}},
    {"12-tinyllama-fp8-minimal.json", {"dense", ""}},
    {"13-tinyllama-fp8-minimal-kv-cache.json", {"dense", ""}},
    {"14-ct-example-int4-asym-tensor-pack.json", {"dense", ""}},
    {"15-ct-example-w8a8-int8-naive.json", {"dense", "", "ct-w8a8-int8-wtensor-static"}},
    {"16-ct-test-w4-channel-pack-frozen.json", {"dense", ""}},
    {"17-tinyllama-w8a8-int8-static-per-tensor-act.json", {"dense", "", "ct-w8a8-int8-static"}},
    {"18-deepseek-coder-v2-lite-w8a8-int8-dynamic-token.json", {"dense", ""}},
    {"19-phi3-mini-fp8-static-naive-frozen.json", {"dense", ""}},
    {"20-hf-docs-llama31-fp8-simplified.json", {"dense", ""}},
    {"21-devstral-2-nvfp4-w4a4-autoround.json", {"dense", ""}},
    {"22-ct-docs-llama3-mxfp4-rtn.json", {"dense", ""}},
    {"23-hf-fp8-deepseek-v3-block128.json", {"dense", ""}},
    {"24-hf-fp8-qwen3-30b-a3b-block128-modules-to-not-convert.json", {"moe", ""}},
    {"25-hf-fp8-minimax-m2.5-block128.json", {"dense", ""}},
};

TEST(PublishedQuantizationConfigs, ArePlannedUnchangedOrRefusedByName) {
  const fs::path dir = fs::path(QPARITY_SOURCE_DIR) / "tests" / "data" / "ct_configs";
  std::map<std::string, std::string> got;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") {
      const std::string name = e.path().filename().string();
      const auto it = kExpected.find(name);
      const std::string kind = it == kExpected.end() ? "dense" : it->second.model;
      try {
        const QuantPlan p =
            plan_from_quantization_config(model(kind), read_json_file(e.path()), name);
        got[name] = "";
        if (it != kExpected.end() && it->second.scheme) {
          const PlanEntry& down = p.method_for("model.layers.0.mlp.down_proj");
          EXPECT_EQ(down.scheme_string(), it->second.scheme) << name;
          EXPECT_EQ(down.sparsity, it->second.sparsity) << name;
        }
        // 04 / 05 record a dense (uncompressed) sparsity: nothing is stored differently.
        if (name.rfind("04-", 0) == 0 || name.rfind("05-", 0) == 0)
          EXPECT_EQ(p.method_for("model.layers.0.mlp.down_proj").sparsity, "") << name;
        if (name.rfind("10-", 0) == 0)
          EXPECT_EQ(p.method_for("lm_head").sparsity, "") << name << " (lm_head is ignored)";
      } catch (const Error& err) {
        got[name] = err.what();
      }
    }
  EXPECT_GE(got.size(), 20u);
  int planned = 0;
  for (const auto& [name, result] : got) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(kExpected.count(name)) << "not in the table: " << result;
    const std::string want = kExpected.at(name).result;
    if (want.empty()) {
      EXPECT_EQ(result, "") << "refused";
      planned += result.empty();
    } else {
      EXPECT_THAT(result, ::testing::HasSubstr(want));
    }
  }
  std::cout << planned << " of " << got.size() << " published configs planned unchanged\n";
}

}  // namespace
}  // namespace qparity
