#include "core/config/model_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "core/config/chatglm_config.h"
#include "core/error.h"

namespace qparity {

namespace {

struct ArchInfo {
  Arch arch;
  std::string_view hf_name;
  std::string_view model_type;
  std::string_view class_prefix;
  bool has_qk_norm;
  bool is_moe;
  bool head_dim_required;  // Qwen3's HF default (128) is not hidden/heads; insist on the file's
  int64_t default_max_position_embeddings;  // the HF config class default
  bool own_keys;  // a config of its own vocabulary (ChatGLM2: chatglm_config.h reads it)
  // An image-text class: its language model is read from `text_config` as this text class
  // (empty: not image-text) with that model_type.
  std::string_view text_class = "";
  std::string_view text_model_type = "";
  // Read only as an image-text class's text_config: not a checkpoint architecture of its own.
  bool nested_only = false;
};

// Mistral is Llama's computation with a sliding-window mask (HF MistralForCausalLM; SGLang and
// Mini-SGLang register it as an alias of their Llama class). ChatGLM2's remote-code configs name
// ChatGLMModel (as published) or ChatGLMForConditionalGeneration; both are the same model.
// Qwen3.5's text model (Qwen3_5ForCausalLM, model_type qwen3_5_text): hybrid Gated DeltaNet /
// gated full attention layers (qwen3_5_config in parse_model_config).
// The image-text classes (Qwen3_5ForConditionalGeneration, Qwen3VLForConditionalGeneration) are
// read as their language models (parse_image_text_config); Qwen3-VL's text decoder is Qwen3's
// blocks (Qwen3VLText* classes).
constexpr std::array<ArchInfo, 11> kArchs = {{
    {Arch::kLlama, "LlamaForCausalLM", "llama", "Llama", false, false, false, 2048, false},
    {Arch::kQwen3, "Qwen3ForCausalLM", "qwen3", "Qwen3", true, false, true, 32768, false},
    {Arch::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3Moe", true, true, true, 32768,
     false},
    {Arch::kMistral, "MistralForCausalLM", "mistral", "Mistral", false, false, false, 131072,
     false},
    {Arch::kChatGlm2, "ChatGLMModel", "chatglm", "ChatGLM", false, false, false, 2048, true},
    {Arch::kChatGlm2, "ChatGLMForConditionalGeneration", "chatglm", "ChatGLM", false, false, false,
     2048, true},
    {Arch::kQwen3_5, "Qwen3_5ForCausalLM", "qwen3_5_text", "Qwen3_5", true, false, true, 32768,
     false},
    {Arch::kQwen3_5, "Qwen3_5ForConditionalGeneration", "qwen3_5", "Qwen3_5", true, false, true,
     32768, false, "Qwen3_5ForCausalLM", "qwen3_5_text"},
    {Arch::kQwen3Vl, "Qwen3VLForConditionalGeneration", "qwen3_vl", "Qwen3VLText", true, false,
     true, 128000, false, "Qwen3VLTextModel", "qwen3_vl_text"},
    // Qwen3-VL's text decoder as parse_image_text_config reads it (no checkpoint names it).
    {Arch::kQwen3Vl, "Qwen3VLTextModel", "qwen3_vl_text", "Qwen3VLText", true, false, true, 128000,
     false, "", "", true},
    // gpt-oss: its keys besides Llama's are read by parse_gpt_oss (GptOssConfig's defaults).
    {Arch::kGptOss, "GptOssForCausalLM", "gpt_oss", "GptOss", false, false, false, 131072, false},
}};

const ArchInfo& arch_info(Arch a) {  // the first entry of the arch: its canonical HF name
  for (const auto& info : kArchs)
    if (info.arch == a) return info;
  throw Error("ModelConfig", "unknown Arch value");
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string fmt_number(double d) {
  std::ostringstream s;
  s.precision(17);
  s << d;
  return s.str();
}

int64_t require_int(const Json& j, std::string_view key, const std::string& where) {
  return as_int(require_key(j, key, where), key_where(where, key));
}

// Sizes beyond any real model are rejected so that a corrupt (or fuzzed) config cannot make the
// module enumeration allocate without bound; the caps are far above every published model.
constexpr int64_t kMaxSize = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = 4096;

int64_t check_size(int64_t v, std::string_view key, const std::string& where, int64_t max) {
  if (v <= 0) throw Error(key_where(where, key), "must be positive, got " + std::to_string(v));
  if (v > max)
    throw Error(key_where(where, key),
                std::to_string(v) + " exceeds the supported maximum " + std::to_string(max));
  return v;
}

int64_t require_positive(const Json& j, std::string_view key, const std::string& where,
                         int64_t max = kMaxSize) {
  return check_size(require_int(j, key, where), key, where, max);
}

std::optional<int64_t> opt_positive(const Json& j, std::string_view key, const std::string& where,
                                    int64_t max = kMaxSize) {
  const auto v = opt_int(j, key, where);
  if (v) check_size(*v, key, where, max);
  return v;
}

double require_positive_number(const Json& j, std::string_view key, const std::string& where) {
  const double v = as_number(require_key(j, key, where), key_where(where, key));
  if (!(v > 0.0)) throw Error(key_where(where, key), "must be positive, got " + fmt_number(v));
  return v;
}

std::optional<double> opt_positive_number(const Json& j, std::string_view key,
                                          const std::string& where) {
  const auto v = opt_number(j, key, where);
  if (v && !(*v > 0.0))
    throw Error(key_where(where, key), "must be positive, got " + fmt_number(*v));
  return v;
}

std::vector<double> number_list(const Json& j, std::string_view key, const std::string& where) {
  const Json& v = require_key(j, key, where);
  const std::string kw = key_where(where, key);
  if (!v.is_array()) throw Error(kw, "expected a list of numbers, got " + json_type_name(v));
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(as_number(v[i], kw + "[" + std::to_string(i) + "]"));
  return out;
}

constexpr std::array<RopeType, 6> kRopeTypes = {RopeType::kDefault, RopeType::kLinear,
                                                RopeType::kDynamic, RopeType::kLlama3,
                                                RopeType::kYarn,    RopeType::kLongrope};

std::string implemented_rope_list() {
  std::vector<std::string> names;
  for (RopeType t : kRopeTypes)
    if (rope_type_implemented(t)) names.emplace_back(rope_type_name(t));
  return join(names, ", ");
}

// `layer_types` verbatim into c.layer_types when the key is given (false when absent or null):
// one entry per layer, each full_attention or `other` (the class's second kind, `what` naming the
// class's layers in errors).
bool read_layer_types(const Json& j, const std::string& where, ModelConfig& c, LayerType other_type,
                      const std::string& other, const std::string& what) {
  auto lt = j.find("layer_types");
  if (lt == j.end() || lt->is_null()) return false;
  const std::string kw = key_where(where, "layer_types");
  const auto types = as_string_list(*lt, kw);
  if (static_cast<int64_t>(types.size()) != c.num_layers)
    throw Error(kw, "lists " + std::to_string(types.size()) + " layers, num_hidden_layers is " +
                        std::to_string(c.num_layers));
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "full_attention")
      c.layer_types.push_back(LayerType::kFullAttention);
    else if (types[i] == other)
      c.layer_types.push_back(other_type);
    else
      throw Error(key_where(where, "layer_types[" + std::to_string(i) + "]"),
                  "'" + types[i] + "' is not " + what + " (full_attention, " + other + ")");
  }
  return true;
}

// Qwen3_5TextConfig: `layer_types` verbatim, else every full_attention_interval-th layer (default
// 4) is full attention; the Gated DeltaNet sizes; the gated attention and zero-centred norms
// every Qwen3.5 layer has.
void parse_qwen3_5_mixers(const Json& j, const std::string& where, ModelConfig& c) {
  if (!read_layer_types(j, where, c, LayerType::kLinearAttention, "linear_attention",
                        "a Qwen3.5 token mixer")) {
    const int64_t interval =
        opt_positive(j, "full_attention_interval", where, kMaxLayers).value_or(4);
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval != 0 ? LayerType::kLinearAttention
                                                      : LayerType::kFullAttention);
  }
  LinearAttentionDims& d = c.linear;
  d.conv_kernel = opt_positive(j, "linear_conv_kernel_dim", where, 64).value_or(4);
  d.key_head_dim = opt_positive(j, "linear_key_head_dim", where).value_or(128);
  d.value_head_dim = opt_positive(j, "linear_value_head_dim", where).value_or(128);
  d.num_key_heads = opt_positive(j, "linear_num_key_heads", where).value_or(16);
  d.num_value_heads = opt_positive(j, "linear_num_value_heads", where).value_or(32);
  if (d.num_value_heads % d.num_key_heads != 0)
    throw Error(where, "linear_num_value_heads (" + std::to_string(d.num_value_heads) +
                           ") is not a multiple of linear_num_key_heads (" +
                           std::to_string(d.num_key_heads) + ")");
  if (d.state_size() > kMaxSize)
    throw Error(where, "a Gated DeltaNet state of " + std::to_string(d.state_size()) +
                           " values exceeds the supported maximum " + std::to_string(kMaxSize));
  // Keys vLLM reads (Qwen3NextAttention / QwenGatedDeltaNetAttention) that change the math; the
  // reference implements their defaults only.
  if (!opt_bool(j, "attn_output_gate", where).value_or(true))
    throw Error(key_where(where, "attn_output_gate"),
                "false is not implemented by the qparity reference (Qwen3.5 gates attention)");
  if (const auto g = opt_string(j, "output_gate_type", where); g && *g != "silu" && *g != "swish")
    throw Error(key_where(where, "output_gate_type"),
                "'" + *g + "' is not implemented by the qparity reference (silu)");
  if (opt_bool(j, "layer_scale", where).value_or(false))
    throw Error(key_where(where, "layer_scale"),
                "true is not implemented by the qparity reference");
  c.attn_output_gate = true;
  c.zero_centred_norms = true;
}

// GptOssConfig (transformers models/gpt_oss/configuration_gpt_oss.py): every layer is a sparse
// MoE block of num_local_experts experts of intermediate_size, top num_experts_per_tok; layers
// alternate sliding_attention (even i) / full_attention unless layer_types says otherwise; the
// sliding window defaults to 128; attention has biases (attention_bias defaults to true) and
// sinks; the experts' clamped SwiGLU has swiglu_alpha (1.702) and swiglu_limit (7.0).
void parse_gpt_oss(const Json& j, const std::string& where, ModelConfig& c) {
  const auto ne = opt_int(j, "num_experts", where);
  const auto nle = opt_int(j, "num_local_experts", where);
  if (ne && nle && *ne != *nle)
    throw Error(where, "num_experts (" + std::to_string(*ne) + ") and num_local_experts (" +
                           std::to_string(*nle) + ") disagree");
  c.num_experts = nle ? require_positive(j, "num_local_experts", where, kMaxExperts)
                      : opt_positive(j, "num_experts", where, kMaxExperts).value_or(128);
  c.num_experts_per_tok = opt_positive(j, "num_experts_per_tok", where).value_or(4);
  // The original release also writes experts_per_token (OpenAI's own config name).
  if (const auto ept = opt_int(j, "experts_per_token", where); ept && *ept != c.num_experts_per_tok)
    throw Error(key_where(where, "experts_per_token"), std::to_string(*ept) +
                                                           " disagrees with num_experts_per_tok " +
                                                           std::to_string(c.num_experts_per_tok));
  if (c.num_experts_per_tok > c.num_experts)
    throw Error(where, "num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                           ") exceeds num_local_experts (" + std::to_string(c.num_experts) + ")");
  c.moe_intermediate_size = c.intermediate;
  c.norm_topk_prob = true;  // a softmax over the chosen k logits sums to 1
  c.topk_then_softmax = true;
  c.router_bias = c.expert_bias = c.attention_sinks = true;
  c.attention_bias = opt_bool(j, "attention_bias", where).value_or(true);
  if (!c.attention_bias)
    throw Error(key_where(where, "attention_bias"),
                "false is not implemented by the qparity reference (GptOssAttention has biases)");
  // The released config writes swiglu_limit 7.0. transformers 5.17's GptOssExperts runs alpha
  // 1.702 and limit 7.0 whatever the config says (read off its source on the device); vLLM's
  // FusedMoEConfig takes a swiglu_limit (default 7.0). Another value would be run differently by
  // the two, so it is refused.
  c.swiglu_alpha = opt_positive_number(j, "swiglu_alpha", where).value_or(1.702);
  c.swiglu_limit = opt_positive_number(j, "swiglu_limit", where).value_or(7.0);
  if (c.swiglu_alpha != 1.702)
    throw Error(key_where(where, "swiglu_alpha"),
                fmt_number(c.swiglu_alpha) +
                    " is not 1.702, which transformers' GptOssExperts hard-codes (the engines "
                    "would disagree)");
  if (c.swiglu_limit != 7.0)
    throw Error(key_where(where, "swiglu_limit"),
                fmt_number(c.swiglu_limit) +
                    " is not 7.0, which transformers' GptOssExperts hard-codes (the engines "
                    "would disagree)");
  auto sw = j.find("sliding_window");
  if (sw == j.end())
    c.sliding_window = 128;
  else if (!sw->is_null())
    c.sliding_window = check_size(as_int(*sw, key_where(where, "sliding_window")), "sliding_window",
                                  where, int64_t{1} << 40);
  if (!read_layer_types(j, where, c, LayerType::kSlidingAttention, "sliding_attention",
                        "a gpt-oss layer")) {
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % 2 != 0 ? LayerType::kSlidingAttention
                                               : LayerType::kFullAttention);
  }
  bool sliding = false;
  for (LayerType t : c.layer_types)
    sliding = sliding || t == LayerType::kSlidingAttention;
  if (sliding && c.sliding_window == 0)
    throw Error(key_where(where, "sliding_window"),
                "is null but layer_types has sliding_attention layers");
}

}  // namespace

namespace {

// An image-text config: its language model is `text_config` read as the text class, with the
// keys transformers keeps at the top level (tie_word_embeddings, dtype) filled in from there when
// text_config lacks them.
ModelConfig parse_text_model(const Json& j, const std::string& where, const ArchInfo& info);

ModelConfig parse_image_text_config(const Json& j, const std::string& where, const ArchInfo& info) {
  const Json& tc = require_key(j, "text_config", where);
  const std::string tw = key_where(where, "text_config");
  require_object(tc, tw);
  Json text = tc;
  if (auto mt = opt_string(tc, "model_type", tw); mt && *mt != info.text_model_type)
    throw Error(key_where(tw, "model_type"), "'" + *mt + "' is not " + std::string(info.hf_name) +
                                                 "'s language model (expected '" +
                                                 std::string(info.text_model_type) + "')");
  for (const char* key : {"tie_word_embeddings", "dtype", "torch_dtype"})
    if (!text.contains(key) && j.contains(key)) text[key] = j.at(key);
  // Both levels name the tie; which one a loader reads differs between versions, so two that
  // disagree leave lm_head undetermined.
  if (j.contains("tie_word_embeddings") && tc.contains("tie_word_embeddings") &&
      j.at("tie_word_embeddings") != tc.at("tie_word_embeddings"))
    throw Error(key_where(where, "tie_word_embeddings"),
                j.at("tie_word_embeddings").dump() + " disagrees with text_config's " +
                    tc.at("tie_word_embeddings").dump() +
                    " (whether lm_head is the embedding is then undetermined)");
  const ArchInfo* text_info = nullptr;
  for (const auto& a : kArchs)
    if (a.hf_name == info.text_class) text_info = &a;
  if (!text_info) throw Error(where, "no text class " + std::string(info.text_class));  // kArchs
  ModelConfig c = parse_text_model(text, tw, *text_info);
  c.arch_name = std::string(info.hf_name);
  c.model_type = opt_string(j, "model_type", where).value_or("");
  if (!c.model_type.empty() && c.model_type != info.model_type)
    throw Error(key_where(where, "model_type"), "'" + c.model_type + "' does not match " +
                                                    std::string(info.hf_name) + " (expected '" +
                                                    std::string(info.model_type) + "')");
  c.image_text = true;
  for (auto [key, field] : {std::pair{"image_token_id", &c.image_token_id},
                            std::pair{"vision_start_token_id", &c.vision_start_token_id}})
    if (const auto v = opt_int(j, key, where)) {
      if (*v < 0) throw Error(key_where(where, key), "must be a token id >= 0");
      *field = *v;
    }
  return c;
}

}  // namespace

bool ModelConfig::has_linear_attention() const {
  return std::find(layer_types.begin(), layer_types.end(), LayerType::kLinearAttention) !=
         layer_types.end();
}

// `dtype` (transformers 5) wins over the legacy `torch_dtype` when both are written.
std::string parse_config_dtype(const Json& j, const std::string& where) {
  for (std::string_view key : {"dtype", "torch_dtype"}) {
    auto v = opt_string(j, key, where);
    if (!v) continue;
    std::string d = *v;
    if (d.rfind("torch.", 0) == 0) d = d.substr(6);
    if (d != "bfloat16" && d != "float16" && d != "float32")
      throw Error(key_where(where, key),
                  "unsupported model dtype '" + *v + "' (expected bfloat16, float16 or float32)");
    return d;
  }
  return "";
}

std::string_view arch_name(Arch a) {
  return arch_info(a).hf_name;
}
std::string_view arch_class_prefix(Arch a) {
  return arch_info(a).class_prefix;
}

std::string_view arch_model_type(Arch a) {
  return arch_info(a).model_type;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& info : kArchs)
    if (!info.nested_only) out.emplace_back(info.hf_name);
  return out;
}

std::string_view rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLongrope:
      return "longrope";
  }
  return "?";
}

bool rope_type_implemented(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
    case RopeType::kLinear:
    case RopeType::kLlama3:
    case RopeType::kYarn:
      return true;
    case RopeType::kDynamic:
    case RopeType::kLongrope:
      return false;
  }
  return false;
}

RopeScaling parse_rope_scaling(const Json& j, const std::string& where) {
  require_object(j, where);
  RopeScaling r;
  // HF reads `rope_type` and falls back to the legacy `type`.
  const auto rope_type = opt_string(j, "rope_type", where);
  const auto legacy_type = opt_string(j, "type", where);
  if (rope_type && legacy_type && *rope_type != *legacy_type)
    throw Error(where, "rope_type '" + *rope_type + "' and type '" + *legacy_type + "' disagree");
  const std::string name = rope_type ? *rope_type : legacy_type ? *legacy_type : "default";
  bool found = false;
  for (RopeType t : kRopeTypes) {
    if (rope_type_name(t) == name) {
      r.type = t;
      found = true;
    }
  }
  if (!found) {
    std::vector<std::string> known;
    for (RopeType t : kRopeTypes)
      known.emplace_back(rope_type_name(t));
    throw Error(where, "unknown rope type '" + name + "' (known: " + join(known, ", ") + ")");
  }

  r.original_max_position_embeddings =
      opt_positive(j, "original_max_position_embeddings", where, int64_t{1} << 40);
  switch (r.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
    case RopeType::kDynamic:
      r.factor = require_positive_number(j, "factor", where);
      break;
    case RopeType::kLlama3: {
      r.factor = require_positive_number(j, "factor", where);
      r.low_freq_factor = require_positive_number(j, "low_freq_factor", where);
      r.high_freq_factor = require_positive_number(j, "high_freq_factor", where);
      r.original_max_position_embeddings =
          require_positive(j, "original_max_position_embeddings", where, int64_t{1} << 40);
      // The llama3 smoothing divides by (high - low).
      if (!(*r.high_freq_factor > *r.low_freq_factor))
        throw Error(where, "llama3 rope needs high_freq_factor (" +
                               fmt_number(*r.high_freq_factor) + ") > low_freq_factor (" +
                               fmt_number(*r.low_freq_factor) + ")");
      break;
    }
    case RopeType::kYarn: {
      r.factor = require_positive_number(j, "factor", where);
      r.attention_factor = opt_positive_number(j, "attention_factor", where);
      r.beta_fast = opt_number(j, "beta_fast", where).value_or(32.0);
      r.beta_slow = opt_number(j, "beta_slow", where).value_or(1.0);
      r.mscale = opt_number(j, "mscale", where);
      r.mscale_all_dim = opt_number(j, "mscale_all_dim", where);
      r.truncate = opt_bool(j, "truncate", where);
      break;
    }
    case RopeType::kLongrope: {
      r.factor = opt_positive_number(j, "factor", where).value_or(1.0);
      r.attention_factor = opt_positive_number(j, "attention_factor", where);
      r.short_factor = number_list(j, "short_factor", where);
      r.long_factor = number_list(j, "long_factor", where);
      break;
    }
  }
  return r;
}

bool ModelConfig::is_moe_layer(int64_t i) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end())
    return false;
  return (i + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(const Json& j, const std::string& where) {
  require_object(j, where);

  // --- architecture ---
  const auto archs =
      as_string_list(require_key(j, "architectures", where), key_where(where, "architectures"));
  if (archs.empty()) throw Error(key_where(where, "architectures"), "is empty");
  // HF instantiates architectures[0]; so do we.
  const ArchInfo* info = nullptr;
  for (const auto& a : kArchs)
    if (a.hf_name == archs[0] && !a.nested_only) info = &a;
  if (!info)
    throw Error(key_where(where, "architectures"),
                "unsupported architecture '" + archs[0] +
                    "' (supported: " + join(supported_architectures(), ", ") + ")");
  if (info->own_keys) return parse_chatglm2_config(j, where, archs[0]);
  if (!info->text_class.empty()) return parse_image_text_config(j, where, *info);
  return parse_text_model(j, where, *info);
}

namespace {

// A text model's config (`info` is its architecture) after the architecture is known.
ModelConfig parse_text_model(const Json& j, const std::string& where, const ArchInfo& ai) {
  ModelConfig c;
  const ArchInfo* info = &ai;
  c.arch = info->arch;
  c.arch_name = std::string(info->hf_name);
  c.has_qk_norm = info->has_qk_norm;
  if (auto mt = opt_string(j, "model_type", where)) {
    if (*mt != info->model_type)
      throw Error(key_where(where, "model_type"), "'" + *mt + "' does not match architecture " +
                                                      c.arch_name + " (expected '" +
                                                      std::string(info->model_type) + "')");
    c.model_type = *mt;
  }

  // --- sizes ---
  c.num_layers = require_positive(j, "num_hidden_layers", where, kMaxLayers);
  c.hidden = require_positive(j, "hidden_size", where);
  c.num_heads = require_positive(j, "num_attention_heads", where);
  c.num_kv_heads = opt_positive(j, "num_key_value_heads", where).value_or(c.num_heads);
  c.intermediate = require_positive(j, "intermediate_size", where);
  c.vocab = require_positive(j, "vocab_size", where);
  c.max_position_embeddings = opt_positive(j, "max_position_embeddings", where, int64_t{1} << 40)
                                  .value_or(info->default_max_position_embeddings);
  if (c.num_heads % c.num_kv_heads != 0)
    throw Error(where, "num_attention_heads (" + std::to_string(c.num_heads) +
                           ") is not divisible by num_key_value_heads (" +
                           std::to_string(c.num_kv_heads) + ")");
  if (auto hd = opt_positive(j, "head_dim", where)) {
    c.head_dim = *hd;
  } else if (info->head_dim_required) {
    throw Error(where, "missing required key 'head_dim' (" + c.arch_name +
                           " does not derive it from hidden_size / num_attention_heads)");
  } else {
    if (c.hidden % c.num_heads != 0)
      throw Error(where, "hidden_size (" + std::to_string(c.hidden) +
                             ") is not divisible by num_attention_heads (" +
                             std::to_string(c.num_heads) + ") and head_dim is not given");
    c.head_dim = c.hidden / c.num_heads;
  }
  if (c.head_dim % 2 != 0)
    throw Error(where, "head_dim (" + std::to_string(c.head_dim) + ") must be even for RoPE");
  c.rotary_dim = c.head_dim;

  c.rms_norm_eps = require_positive_number(j, "rms_norm_eps", where);
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", where).value_or(false);
  c.attention_bias = opt_bool(j, "attention_bias", where).value_or(false);
  c.mlp_bias = opt_bool(j, "mlp_bias", where).value_or(false);
  c.dtype = parse_config_dtype(j, where);

  // --- what the reference does not implement, rejected by name ---
  c.hidden_act = opt_string(j, "hidden_act", where).value_or("silu");
  if (c.hidden_act != "silu")
    throw Error(
        key_where(where, "hidden_act"),
        "'" + c.hidden_act + "' is not implemented by the qparity reference (implemented: silu)");
  if (c.arch == Arch::kMistral) {
    // HF MistralConfig: sliding_window defaults to 4096 when the key is absent; null means none.
    auto it = j.find("sliding_window");
    if (it == j.end())
      c.sliding_window = 4096;
    else if (!it->is_null())
      c.sliding_window = check_size(as_int(*it, key_where(where, "sliding_window")),
                                    "sliding_window", where, int64_t{1} << 40);
  }
  if (opt_bool(j, "use_sliding_window", where).value_or(false))
    throw Error(key_where(where, "use_sliding_window"),
                "sliding-window attention is not implemented by the qparity reference");
  if (c.arch == Arch::kQwen3_5) {
    parse_qwen3_5_mixers(j, where, c);
  } else if (c.arch == Arch::kGptOss) {
    parse_gpt_oss(j, where, c);
  } else if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    const auto types = as_string_list(*lt, key_where(where, "layer_types"));
    for (size_t i = 0; i < types.size(); ++i)
      if (types[i] != "full_attention")
        throw Error(key_where(where, "layer_types[" + std::to_string(i) + "]"),
                    "'" + types[i] + "' is not implemented by the qparity reference for " +
                        c.arch_name +
                        " (implemented: full_attention; linear_attention in Qwen3_5ForCausalLM)");
  }

  // --- RoPE: legacy rope_scaling + rope_theta, or transformers-5 rope_parameters ---
  // HF 5 prefers a non-null rope_scaling over rope_parameters, and a rope_theta inside the dict
  // over the top-level one.
  const Json* rope_dict = nullptr;
  std::string rope_key;
  for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      rope_dict = &*it;
      rope_key = std::string(key);
      break;
    }
  }
  // GptOssConfig.default_theta is 150000; every other class here defaults to 10000.
  c.rope_theta = opt_positive_number(j, "rope_theta", where)
                     .value_or(c.arch == Arch::kGptOss ? 150000.0 : 10000.0);
  // Qwen3_5TextConfig fills in 0.25 when the key is absent.
  double partial_rotary =
      opt_number(j, "partial_rotary_factor", where).value_or(c.arch == Arch::kQwen3_5 ? 0.25 : 1.0);
  if (rope_dict) {
    const std::string rw = key_where(where, rope_key);
    require_object(*rope_dict, rw);
    for (const auto& [k, v] : rope_dict->items())
      if (v.is_object())
        throw Error(rw, "per-layer-type rope parameters ('" + k + "') are not supported");
    c.rope_scaling = parse_rope_scaling(*rope_dict, rw);
    if (auto t = opt_positive_number(*rope_dict, "rope_theta", rw)) c.rope_theta = *t;
    if (auto p = opt_number(*rope_dict, "partial_rotary_factor", rw)) partial_rotary = *p;
    if (!rope_type_implemented(c.rope_scaling.type))
      throw Error(where, rope_key + " type '" + std::string(rope_type_name(c.rope_scaling.type)) +
                             "' is not implemented by the qparity reference (implemented: " +
                             implemented_rope_list() + ")");
  }
  if (!rope_dict && c.arch == Arch::kGptOss) {
    // GptOssConfig.__post_init__ fills in YaRN when no rope parameters are given.
    c.rope_scaling.type = RopeType::kYarn;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.truncate = false;
    c.rope_scaling.original_max_position_embeddings = 4096;
  }
  if (c.arch == Arch::kQwen3_5) {
    // HF compute_default_rope_parameters: dim = int(head_dim * partial_rotary_factor); the first
    // dim channels of each head rotate (rotate-half pairs within them), the rest pass through.
    // Text-only input: Qwen3.5's interleaved M-RoPE (mrope_section) gives its three position rows
    // the same values, so the frequencies it picks per channel are the 1-D ones.
    if (!(partial_rotary > 0.0 && partial_rotary <= 1.0))
      throw Error(key_where(where, "partial_rotary_factor"),
                  "must be in (0, 1], got " + fmt_number(partial_rotary));
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial_rotary);
    if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0)
      throw Error(key_where(where, "partial_rotary_factor"),
                  "head_dim " + std::to_string(c.head_dim) + " x " + fmt_number(partial_rotary) +
                      " gives rotary dim " + std::to_string(c.rotary_dim) +
                      ", which must be positive and even");
  } else if (partial_rotary != 1.0) {
    throw Error(where, "partial_rotary_factor " + fmt_number(partial_rotary) +
                           " is not implemented by the qparity reference for " + c.arch_name +
                           " (only 1.0; partial rotary in Qwen3_5ForCausalLM)");
  }
  // M-RoPE (Qwen3.5, Qwen3-VL): mrope_section assigns the rotary_dim / 2 frequencies, interleaved,
  // to the temporal / height / width position rows (transformers' apply_interleaved_mrope slices
  // by it and silently truncates a section longer than the frequencies). Text-only input gives
  // the three rows equal positions, so no split changes the result; only its form is checked.
  if (rope_dict && rope_dict->contains("mrope_section") &&
      (c.arch == Arch::kQwen3_5 || c.arch == Arch::kQwen3Vl)) {
    const std::string mw = key_where(key_where(where, rope_key), "mrope_section");
    const Json& ms = rope_dict->at("mrope_section");
    if (!ms.is_array() || ms.size() != 3)
      throw Error(mw,
                  "must be a list of 3 section sizes (temporal, height, width), got " + ms.dump());
    for (const Json& v : ms) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        throw Error(mw, "section sizes must be non-negative integers, got " + v.dump());
      c.mrope_section.push_back(v.get<int64_t>());
    }
  }

  // --- MoE ---
  if (info->is_moe) {
    const auto ne = opt_int(j, "num_experts", where);
    const auto nle = opt_int(j, "num_local_experts", where);
    if (ne && nle && *ne != *nle)
      throw Error(where, "num_experts (" + std::to_string(*ne) + ") and num_local_experts (" +
                             std::to_string(*nle) + ") disagree");
    c.num_experts = ne ? require_positive(j, "num_experts", where, kMaxExperts)
                       : require_positive(j, "num_local_experts", where, kMaxExperts);
    c.num_experts_per_tok = require_positive(j, "num_experts_per_tok", where);
    c.moe_intermediate_size = require_positive(j, "moe_intermediate_size", where);
    c.norm_topk_prob = opt_bool(j, "norm_topk_prob", where).value_or(false);
    c.decoder_sparse_step = opt_positive(j, "decoder_sparse_step", where).value_or(1);
    if (c.num_experts_per_tok > c.num_experts)
      throw Error(where, "num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
                             ") exceeds num_experts (" + std::to_string(c.num_experts) + ")");
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      const std::string kw = key_where(where, "mlp_only_layers");
      if (!it->is_array())
        throw Error(kw, "expected a list of integers, got " + json_type_name(*it));
      for (size_t i = 0; i < it->size(); ++i) {
        const std::string ew = key_where(where, "mlp_only_layers[" + std::to_string(i) + "]");
        const int64_t layer = as_int((*it)[i], ew);
        if (layer < 0 || layer >= c.num_layers)
          throw Error(ew, "layer " + std::to_string(layer) + " is out of range [0, " +
                              std::to_string(c.num_layers) + ")");
        c.mlp_only_layers.push_back(layer);
      }
    }
  }
  return c;
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& config_json) {
  return parse_model_config(read_json_file(config_json), config_json.string());
}

Json to_json(const ModelConfig& c) {
  Json rope = {{"rope_type", std::string(rope_type_name(c.rope_scaling.type))}};
  const RopeScaling& r = c.rope_scaling;
  if (r.type != RopeType::kDefault) rope["factor"] = r.factor;
  if (r.low_freq_factor) rope["low_freq_factor"] = *r.low_freq_factor;
  if (r.high_freq_factor) rope["high_freq_factor"] = *r.high_freq_factor;
  if (r.original_max_position_embeddings)
    rope["original_max_position_embeddings"] = *r.original_max_position_embeddings;
  if (r.attention_factor) rope["attention_factor"] = *r.attention_factor;
  if (r.beta_fast) rope["beta_fast"] = *r.beta_fast;
  if (r.beta_slow) rope["beta_slow"] = *r.beta_slow;
  if (r.mscale) rope["mscale"] = *r.mscale;
  if (r.mscale_all_dim) rope["mscale_all_dim"] = *r.mscale_all_dim;
  if (r.truncate) rope["truncate"] = *r.truncate;
  if (!r.short_factor.empty()) rope["short_factor"] = r.short_factor;
  if (!r.long_factor.empty()) rope["long_factor"] = r.long_factor;

  Json out = {
      {"architecture", c.arch_name},
      {"model_type", c.model_type},
      {"num_layers", c.num_layers},
      {"hidden", c.hidden},
      {"num_heads", c.num_heads},
      {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate", c.intermediate},
      {"vocab", c.vocab},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias},
      {"qkv_bias", c.has_qkv_bias()},
      {"rotary_dim", c.rotary_dim},
      {"rope_interleaved", c.rope_interleaved},
      {"sliding_window", c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr)},
      {"mlp_bias", c.mlp_bias},
      {"has_qk_norm", c.has_qk_norm},
      {"hidden_act", c.hidden_act},
      {"dtype", c.dtype},
  };
  if (c.image_text) out["image_text"] = true;
  if (!c.layer_types.empty()) {
    std::vector<std::string> types;
    for (LayerType t : c.layer_types)
      types.emplace_back(t == LayerType::kLinearAttention    ? "linear_attention"
                         : t == LayerType::kSlidingAttention ? "sliding_attention"
                                                             : "full_attention");
    out["layer_types"] = types;
    out["attn_output_gate"] = c.attn_output_gate;
    out["zero_centred_norms"] = c.zero_centred_norms;
  }
  if (c.has_linear_attention())
    out["linear_attention"] = {{"conv_kernel", c.linear.conv_kernel},
                               {"key_head_dim", c.linear.key_head_dim},
                               {"value_head_dim", c.linear.value_head_dim},
                               {"num_key_heads", c.linear.num_key_heads},
                               {"num_value_heads", c.linear.num_value_heads}};
  if (c.attention_sinks) {
    out["gpt_oss"] = {{"attention_sinks", true},        {"router_bias", c.router_bias},
                      {"expert_bias", c.expert_bias},   {"router", "softmax over the top-k logits"},
                      {"swiglu_alpha", c.swiglu_alpha}, {"swiglu_limit", c.swiglu_limit}};
  }
  if (c.is_moe()) {
    std::vector<int64_t> sparse;
    for (int64_t i = 0; i < c.num_layers; ++i)
      if (c.is_moe_layer(i)) sparse.push_back(i);
    out["moe"] = {
        {"num_experts", c.num_experts},
        {"num_experts_per_tok", c.num_experts_per_tok},
        {"moe_intermediate_size", c.moe_intermediate_size},
        {"norm_topk_prob", c.norm_topk_prob},
        {"decoder_sparse_step", c.decoder_sparse_step},
        {"mlp_only_layers", c.mlp_only_layers},
        {"sparse_layers", sparse},
    };
  }
  return out;
}

}  // namespace qparity
