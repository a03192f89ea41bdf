// GPTQ, AWQ and ModelOpt configs transcribed from public checkpoints and producers' files
// (tests/data/producer_configs/, each file's source and fidelity in SOURCES.md there), planned
// unchanged on a Llama-shaped model: each is planned, or refused naming the rule that qparity
// does not implement. The table is the support status; a change either way fails here until the
// table says so. Files that are a producer's own side file (AutoGPTQ quantize_config.json,
// AutoAWQ quant_config.json) are read as build_quant_plan reads them, their quant_method implied
// by the file name when absent.
#include <filesystem>
#include <iostream>
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

ModelConfig llama() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "torch_dtype": "float16"})"),
                            "config.json");
}

struct Expected {
  const char* result;            // "" = planned; otherwise a substring of the refusal
  const char* scheme = nullptr;  // planned: the scheme of model.layers.1.mlp.down_proj
};

const std::map<std::string, Expected> kExpected = {
    {"gptq-01-thebloke-llama2-13b-chat.json", {"", "ct-w4a16-g128"}},
    {"gptq-02-genz-70b-3bit-actorder.json", {"", "ct-w3a16-ch"}},
    {"gptq-03-wizard-vicuna-30b-g64.json", {"", "ct-w4a16-g64-actorder"}},
    {"gptq-04-wizard-vicuna-30b-8bit-quantize-config.json", {"", "ct-w8a16-ch"}},
    {"gptq-05-qwen-vl-chat-int4.json", {"", "ct-w4a16-g128"}},
    {"gptq-06-qwen-7b-chat-int8-quantize-config.json", {""}},
    {"gptq-07-synthia-7b-8bit-optimum.json", {"", "ct-w8a16-ch"}},
    {"gptq-08-saily-220b-optimum-blocks.json", {"", "ct-w4a16-ch"}},
    {"gptq-09-qwen2-72b-instruct-int4-optimum.json", {"", "ct-w4a16-g128"}},
    {"gptq-10-360zhinao-7b-int4-optimum.json", {"", "ct-w4a16-g128"}},
    {"gptq-11-cortecs-llama3-70b-marlinflag.json", {"", "ct-w4a16-g128-actorder"}},
    {"gptq-12-modelcloud-internlm25-gptqmodel095.json", {"", "ct-w4a16-g128-actorder"}},
    // dynamic: layers >= 2 skipped ("-:"), layer 1 overridden to 8 bits group 32.
    {"gptq-13-modelcloud-tinyllama-dynamic.json", {"", "ct-w8a16-g32"}},
    {"gptq-14-seed-oss-36b-int8-gptqmodel.json", {"", "ct-w8a16-g128"}},
    {"gptq-15-smollm-360m-2bit-gptqmodel.json", {"", "ct-w2a16-g128-actorder"}},
    // AutoRound's GPTQ export: planned as GPTQ v1, its tuning keys listed as unknown.
    {"gptq-16-opea-qwen25-7b-autoround.json", {"", "ct-w4a16-g128"}},
    {"awq-01-thebloke-mammoth-7b.json", {"", "ct-w4a16-g128-asym"}},
    {"awq-02-ldcc-qwen25-72b-ko-transformers.json", {"", "ct-w4a16-g128-asym"}},
    {"awq-03-marcsun13-opt-125m.json", {"", "ct-w4a16-g128-asym"}},
    // modules_to_not_convert "model.layers.1." leaves layer 1 unquantized.
    {"awq-04-quanttrio-deepseek-v32-exp.json", {"", "bf16"}},
    {"awq-05-huozi3-quant-config.json", {"", "ct-w4a16-g128-asym"}},
    {"awq-06-weni-llama3-quant-config.json", {"", "ct-w4a16-g128-asym"}},
    {"awq-07-thebloke-qwen-7b-chat-quant-config.json", {"", "ct-w4a16-g128-asym"}},
    // AutoRound's symmetric AWQ export: no zero points, a layout AutoAWQ's GEMM cannot hold.
    {"awq-08-smallthinker-3b-autoround.json", {"zero_point"}},
    // ModelOpt: FP8 (and its FP8 KV cache), NVFP4 and the mixed-precision map are read.
    {"modelopt-01-llama31-70b-instruct-fp8.json", {"", "fp8-tensor"}},
    {"modelopt-02-llama31-405b-instruct-fp8.json", {"", "fp8-tensor"}},
    {"modelopt-03-deepseek-v31-nvfp4.json", {"", "nvfp4"}},
    {"modelopt-04-qwen3-235b-a22b-nvfp4.json", {"", "nvfp4"}},
    {"modelopt-05-nemotron3-nano-30b-nvfp4.json", {"", "nvfp4"}},
    // DeepSeek-V4's own module names ("layers.0.ffn.experts"): none is a Llama linear, so every
    // module stays unquantized here (each entry a plan warning).
    {"modelopt-06-deepseek-v4-flash-mixed-precision.json", {"", "bf16"}},
    {"modelopt-07-hunyuan-1p8b-fp8-no-producer.json", {"", "fp8-tensor"}},
    {"modelopt-08-gemma4-31b-it-nvfp4-config.json", {"", "nvfp4"}},
    {"modelopt-09-kimi-k25-nvfp4-config.json", {"", "nvfp4"}},
};

// The producer file a corpus entry is (its name says so), for the implied quant_method.
std::string original_name(const std::string& leaf) {
  if (leaf.ends_with("-quantize-config.json")) return "quantize_config.json";
  if (leaf.ends_with("-quant-config.json")) return "quant_config.json";
  return "config.json";
}

TEST(PublishedProducerConfigs, ArePlannedUnchangedOrRefusedByName) {
  const fs::path dir = fs::path(QPARITY_SOURCE_DIR) / "tests" / "data" / "producer_configs";
  std::map<std::string, std::string> got;
  std::map<std::string, int> planned_by_producer;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    const std::string name = e.path().filename().string();
    std::string implied;
    try {
      const Json block =
          with_implied_quant_method(read_json_file(e.path()), original_name(name), &implied);
      const QuantPlan p = plan_from_quantization_config(llama(), block, name);
      got[name] = "";
      const auto it = kExpected.find(name);
      if (it != kExpected.end() && it->second.scheme)
        EXPECT_EQ(p.method_for("model.layers.1.mlp.down_proj").scheme_string(), it->second.scheme)
            << name;
      EXPECT_FALSE(p.rules().empty()) << name << ": the producer's rules are named";
      ++planned_by_producer[name.substr(0, name.find('-'))];
    } catch (const Error& err) {
      got[name] = err.what();
    }
    if (original_name(name) != "config.json" && !got[name].empty())
      ADD_FAILURE() << name << " (a producer side file) refused: " << got[name];
  }
  for (const auto& [name, result] : got) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(kExpected.count(name)) << "not in the table: " << result;
    const std::string want = kExpected.at(name).result;
    if (want.empty())
      EXPECT_EQ(result, "") << "refused";
    else
      EXPECT_THAT(result, ::testing::HasSubstr(want));
  }
  EXPECT_EQ(got.size(), kExpected.size());
  EXPECT_GE(planned_by_producer["gptq"], 5);
  EXPECT_GE(planned_by_producer["awq"], 5);
  for (const auto& [producer, n] : planned_by_producer)
    std::cout << producer << ": " << n << " published configs planned unchanged\n";
}

}  // namespace
}  // namespace qparity
