#pragma once
// HF `config.json` -> one normalized ModelConfig (the shape mini-sglang's ModelConfig.from_hf
// gives): parse once, validate once, and let every model, loader and quantization plan read plain
// fields instead of probing the JSON. The architecture is chosen by the `architectures` field
// through a registry whose error lists the supported names; anything the reference does not
// implement (rope variants, activations) is rejected by name here, not later. ChatGLM2's own
// config keys (kv_channels, ffn_hidden_size, multi_query_group_num, ...) are read by
// chatglm_config.h into the same fields.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json_util.h"

namespace qparity {

// kQwen3Vl: Qwen3-VL's text decoder (Qwen3's blocks), read from a Qwen3VLForConditionalGeneration
// checkpoint.
enum class Arch : uint8_t {
  kLlama,
  kQwen3,
  kQwen3Moe,
  kMistral,
  kChatGlm2,
  kQwen3_5,
  kQwen3Vl,
  kGptOss,
};

// A decoder layer's token mixer (HF `layer_types`): softmax attention over every earlier
// position, softmax attention over the last sliding_window positions (gpt-oss's alternate
// layers), or Qwen3.5's Gated DeltaNet linear attention.
enum class LayerType : uint8_t { kFullAttention, kLinearAttention, kSlidingAttention };

// Qwen3.5's Gated DeltaNet sizes (`linear_*` keys): key heads of key_head_dim for q and k, value
// heads of value_head_dim for v, z, the state and the output; value head j reads key head
// j / (num_value_heads / num_key_heads).
struct LinearAttentionDims {
  int64_t conv_kernel = 0;  // linear_conv_kernel_dim: taps of the depthwise causal conv
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
  int64_t num_key_heads = 0;
  int64_t num_value_heads = 0;

  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // q | k | v channels
  int64_t state_size() const { return num_value_heads * key_head_dim * value_head_dim; }
};

// The HF class name in `architectures` ("LlamaForCausalLM", ...).
std::string_view arch_name(Arch a);
// Prefix of the arch's HF module classes ("Llama" -> LlamaAttention, LlamaRMSNorm, ...).
std::string_view arch_class_prefix(Arch a);
// Its model_type ("llama", "chatglm", ...).
std::string_view arch_model_type(Arch a);
// Every architecture the registry knows, in registry order.
std::vector<std::string> supported_architectures();

enum class RopeType : uint8_t { kDefault, kLinear, kDynamic, kLlama3, kYarn, kLongrope };

// HF spelling ("default", "linear", "dynamic", "llama3", "yarn", "longrope").
std::string_view rope_type_name(RopeType t);
// Whether the qparity reference computes this rope variant (default, linear, llama3, yarn).
bool rope_type_implemented(RopeType t);

// HF `rope_scaling` / `rope_parameters`. Fields a variant does not use stay unset; defaults that
// HF fills in (yarn beta_fast 32, beta_slow 1) are filled here too so consumers need no HF lore.
struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  std::optional<double> low_freq_factor;                    // llama3
  std::optional<double> high_freq_factor;                   // llama3
  std::optional<int64_t> original_max_position_embeddings;  // llama3, yarn, longrope, dynamic
  std::optional<double> attention_factor;                   // yarn, longrope
  std::optional<double> beta_fast;                          // yarn
  std::optional<double> beta_slow;                          // yarn
  std::optional<double> mscale;                             // yarn (DeepSeek style)
  std::optional<double> mscale_all_dim;                     // yarn (DeepSeek style)
  std::optional<bool> truncate;                             // yarn
  std::vector<double> short_factor;                         // longrope
  std::vector<double> long_factor;                          // longrope
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;   // as written in `architectures`
  std::string model_type;  // "llama", "qwen3", "qwen3_moe" (empty if the file omits it)

  int64_t num_layers = 0;
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // defaults to num_heads
  int64_t head_dim = 0;      // defaults to hidden / num_heads (Llama); required for Qwen3
  int64_t intermediate = 0;  // dense MLP size (Qwen3-MoE: the mlp_only_layers' MLP)
  int64_t vocab = 0;
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 0.0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  // RoPE rotates the first rotary_dim dims of each head (the rest pass through): head_dim, except
  // ChatGLM2 (head_dim / 2). Interleaved: pairs (x[2i], x[2i+1]) as ChatGLM2 / GPT-J rotate them;
  // otherwise Hugging Face's rotate-half pairs (x[i], x[i + rotary_dim / 2]).
  int64_t rotary_dim = 0;
  bool rope_interleaved = false;
  // Sliding-window attention: a query at position p sees keys at positions in
  // (p - sliding_window, p]; 0 for full causal attention. Mistral: every layer (layer_types
  // empty); gpt-oss: the layers layer_types marks sliding_attention (window_of).
  int64_t sliding_window = 0;

  bool tie_word_embeddings = false;
  bool attention_bias = false;  // HF Llama: bias on q/k/v and o_proj
  bool qkv_bias = false;        // bias on q/k/v only (ChatGLM2 add_qkv_bias); implied by the above
  bool mlp_bias = false;
  bool has_qk_norm = false;  // Qwen3 / Qwen3-MoE: RMSNorm on q and k per head before RoPE
  std::string hidden_act = "silu";
  std::string dtype;  // `dtype` (transformers 5) or `torch_dtype`; empty when absent

  // gpt-oss (GptOssForCausalLM): a learned logit per attention head that joins every softmax
  // denominator (HF `sinks`), a bias on the router, and experts whose gate/up output runs the
  // clamped SwiGLU (up.clamp(-limit, limit) + 1) * g * sigmoid(alpha * g), g = gate.clamp(max =
  // limit), with biases on gate/up and down; the router softmax is taken over the top-k logits.
  bool attention_sinks = false;
  bool router_bias = false;
  bool expert_bias = false;
  bool topk_then_softmax = false;
  double swiglu_alpha = 0.0;  // 0: the experts run silu(gate) * up
  double swiglu_limit = 0.0;

  // MoE (Qwen3-MoE, gpt-oss); zero / empty for dense models.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  // Qwen3.5 (Qwen3_5ForCausalLM): per-layer token mixers (empty: every layer full attention),
  // the Gated DeltaNet sizes, the gated full attention (q_proj gives [q | gate] per head, the
  // attention output is multiplied by sigmoid(gate) before o_proj) and the zero-centred RMSNorms
  // (x̂ * (1 + w): decoder, final and q/k norms; the Gated DeltaNet's output norm is plain w).
  std::vector<LayerType> layer_types;
  LinearAttentionDims linear;
  bool attn_output_gate = false;
  bool zero_centred_norms = false;
  // An image-text checkpoint (Qwen3_5ForConditionalGeneration, Qwen3VLForConditionalGeneration):
  // the sizes above are its `text_config`'s, its language model's tensors live under
  // model.language_model.* (core/safetensors/language_model_names.h shows them under model.*),
  // and its vision tower (model.visual.*) is read only where images are given (prompts with
  // image placeholders: CausalLm::forward_image_prompt).
  bool image_text = false;
  // Image prompts (image-text checkpoints): the placeholder token the processor repeats for each
  // merged patch, and the token that must open each image (top-level config keys; -1: absent).
  int64_t image_token_id = -1;
  int64_t vision_start_token_id = -1;
  // Interleaved M-RoPE's (temporal, height, width) frequency counts (rope_parameters'
  // mrope_section; empty when the config has none).
  std::vector<int64_t> mrope_section;

  bool is_moe() const { return num_experts > 0; }
  bool has_qkv_bias() const { return attention_bias || qkv_bias; }
  // HF Qwen3-MoE rule: layer i is sparse iff i is not in mlp_only_layers, num_experts > 0 and
  // (i + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t i) const;
  bool is_linear_attention_layer(int64_t i) const {
    return !layer_types.empty() &&
           layer_types[static_cast<size_t>(i)] == LayerType::kLinearAttention;
  }
  bool has_linear_attention() const;
  // The sliding window of layer i (0: full causal attention).
  int64_t window_of(int64_t i) const {
    if (layer_types.empty()) return sliding_window;
    return layer_types[static_cast<size_t>(i)] == LayerType::kSlidingAttention ? sliding_window : 0;
  }
  int64_t q_size() const { return num_heads * head_dim; }
  // q_proj's rows: q, or per head [q | gate] with the output gate.
  int64_t q_proj_size() const { return attn_output_gate ? 2 * q_size() : q_size(); }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
};

// Parses one `rope_scaling` / `rope_parameters` dict (all known variants, including those the
// reference rejects, so a tool can still show them); `where` names the dict in errors.
RopeScaling parse_rope_scaling(const Json& j, const std::string& where);

// The model dtype of a config: `dtype` (transformers 5) or `torch_dtype`, "bfloat16" / "float16" /
// "float32"; empty when absent; anything else is an Error naming the key.
std::string parse_config_dtype(const Json& j, const std::string& where);

// Parses and validates an HF config; `where` names the source in errors ("config.json").
ModelConfig parse_model_config(const Json& j, const std::string& where);
ModelConfig load_model_config(const std::filesystem::path& config_json);
// Normalized view (what qparity understood), not a round-trip of the HF file.
Json to_json(const ModelConfig& c);

}  // namespace qparity
