#pragma once
// Small model configs and a complete msModelSlim quant_model_description.json builder, shared by
// the plan tests and the scheme-factory tests.
#include <functional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/module_names.h"

namespace qparity::test {

inline Json tiny_llama_json(bool tied = false) {
  Json j = Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "float16"})");
  j["tie_word_embeddings"] = tied;
  return j;
}
inline ModelConfig tiny_llama(bool tied = false) {
  return parse_model_config(tiny_llama_json(tied), "config.json");
}

inline ModelConfig tiny_qwen3_moe() {
  return parse_model_config(Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
    "mlp_only_layers": [1], "vocab_size": 1000, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"})"),
                            "config.json");
}

// The tensors msModelSlim's ascendV1 saver writes for one linear of type `t`.
inline std::vector<std::string> suffixes_of(const std::string& t) {
  if (t == "W8A16") return {"weight", "weight_scale", "weight_offset"};
  if (t == "W8A8" || t == "W8A8S")
    return {"weight", "quant_bias", "input_scale", "input_offset", "deq_scale"};
  if (t == "W8A8_DYNAMIC" || t == "WFP8AFP8_DYNAMIC")
    return {"weight", "weight_scale", "weight_offset"};
  if (t == "W4A8_DYNAMIC") return {"weight", "weight_scale", "weight_offset", "scale_bias"};
  if (t == "W8A8SC") return {"weight", "index", "info", "input_scale", "deq_scale"};
  return {"weight"};
}

// A complete description: every parameter of the model, linears typed by `type_of` (lm_head and
// MoE routers FLOAT unless `type_of` says otherwise).
inline Json describe_model(const ModelConfig& cfg,
                           const std::function<std::string(const LinearModule&)>& type_of,
                           const std::string& model_quant_type, int64_t group_size = 0) {
  const ModuleNames mods(cfg);
  Json d = Json::object();
  d["model.embed_tokens.weight"] = "FLOAT";
  for (const NormModule& n : mods.norms())
    d[n.prefix + ".weight"] = "FLOAT";
  for (const LinearModule& l : mods.linears()) {
    const std::string t = type_of(l);
    for (const std::string& s : suffixes_of(t))
      d[l.prefix + "." + s] = t;
  }
  d["model_quant_type"] = model_quant_type;
  d["version"] = "1.0.0";
  d["group_size"] = group_size;
  d["metadata"] = Json::object();
  d["optional"] = Json::object();
  return d;
}

inline std::string all_but_head(const LinearModule& l, const std::string& t) {
  return l.kind == LinearKind::kLmHead || l.kind == LinearKind::kRouter ? "FLOAT" : t;
}

}  // namespace qparity::test
