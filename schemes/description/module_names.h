#pragma once
// Every module of an HF Llama / Qwen3 / Qwen3-MoE / Mistral / ChatGLM2 / Qwen3.5 model that a
// quantization config can name, with the HF names checkpoints use: the linears (with the class name
// compressed-tensors' class targets match), the MoE expert stacks engines fuse them into, the
// attention modules that own a KV cache, and the norms smooth-quant folds into. Lists are in
// execution order, which is also the order a quantization plan is printed and bisected in.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/config/model_config.h"

namespace qparity {

enum class LinearKind : uint8_t {
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kGateProj,  // dense MLP
  kUpProj,
  kDownProj,
  kRouter,  // MoE `mlp.gate`
  kExpertGate,
  kExpertUp,
  kExpertDown,
  kLmHead,
  // Qwen3.5 Gated DeltaNet (`linear_attn.*`): the input projections (engines fuse qkv | z and
  // b | a, as vLLM's in_proj_qkvz / in_proj_ba) and the output projection.
  kLinearAttnQkv,
  kLinearAttnZ,
  kLinearAttnB,
  kLinearAttnA,
  kLinearAttnOut,
};

// The shard an expert linear fills in an engine's fused stack: w1 = gate_proj and w3 = up_proj
// (stacked as w13), w2 = down_proj.
enum class ExpertShard : uint8_t { kNone, kW1, kW3, kW2 };

std::string_view to_string(LinearKind k);
std::string_view to_string(ExpertShard s);

struct LinearModule {
  std::string prefix;      // "model.layers.3.self_attn.q_proj"
  std::string class_name;  // "Linear" (what class-name targets match)
  LinearKind kind;
  int64_t layer = -1;   // -1 for lm_head
  int64_t expert = -1;  // expert index, -1 outside expert stacks
  ExpertShard shard = ExpertShard::kNone;
  std::string stack;         // "model.layers.3.mlp.experts" for expert linears, else empty
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
  bool tied = false;         // lm_head sharing model.embed_tokens.weight

  bool in_expert_stack() const { return !stack.empty(); }
};

struct ExpertStack {
  std::string prefix;  // "model.layers.3.mlp.experts"
  int64_t layer = 0;
  int64_t num_experts = 0;
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (moe_intermediate_size)
  std::string class_name;    // "ModuleList" in HF transformers 4
};

struct AttentionModule {
  std::string prefix;  // "model.layers.3.self_attn"
  int64_t layer = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  std::string class_name;  // "LlamaAttention", "Qwen3Attention", "Qwen3MoeAttention"
};

// kLinearAttnNorm: the Gated DeltaNet's gated output norm (Qwen3.5 `linear_attn.norm`, over each
// value head).
enum class NormKind : uint8_t {
  kInputLayernorm,
  kPostAttentionLayernorm,
  kFinal,
  kQNorm,
  kKNorm,
  kLinearAttnNorm
};

struct NormModule {
  std::string prefix;  // "model.layers.3.input_layernorm"
  NormKind kind;
  int64_t layer = -1;  // -1 for model.norm
  int64_t dim = 0;
  std::string class_name;     // "LlamaRMSNorm", ...
  bool zero_centred = false;  // Qwen3.5: the checkpoint holds w of x̂ * (1 + w)
  // Linears reading this norm's output: what a smooth-quant scale folded into it rescales.
  std::vector<std::string> consumers;
};

// A Qwen3.5 Gated DeltaNet token mixer ("model.layers.<i>.linear_attn"): besides its linears
// and its norm it holds conv1d.weight [conv_dim, 1, conv_kernel], A_log and dt_bias [value
// heads], tensors no quantization config names.
struct LinearAttentionModule {
  std::string prefix;  // "model.layers.0.linear_attn"
  int64_t layer = 0;
  LinearAttentionDims dims;
};

// A module that is neither a linear nor listed above (embedding, containers, decoder layers);
// kept so that a config target naming one is recognized as "not a Linear" instead of "unknown".
struct OtherModule {
  std::string prefix;
  std::string class_name;
};

class ModuleNames {
 public:
  explicit ModuleNames(const ModelConfig& cfg);

  const std::vector<LinearModule>& linears() const { return linears_; }
  const std::vector<ExpertStack>& expert_stacks() const { return stacks_; }
  // The softmax-attention modules (one per full-attention layer: every layer but Qwen3.5's
  // linear-attention ones).
  const std::vector<AttentionModule>& attentions() const { return attentions_; }
  const std::vector<LinearAttentionModule>& linear_attentions() const { return linear_attns_; }
  const std::vector<NormModule>& norms() const { return norms_; }
  const std::vector<OtherModule>& others() const { return others_; }

  const LinearModule* find_linear(std::string_view prefix) const;
  const ExpertStack* find_stack(std::string_view prefix) const;
  const AttentionModule* find_attention(std::string_view prefix) const;
  const NormModule* find_norm(std::string_view prefix) const;
  // Any module at all (linear, stack, attention, norm or other).
  bool contains(std::string_view prefix) const;

  static constexpr std::string_view kEmbedding = "model.embed_tokens";

 private:
  std::vector<LinearModule> linears_;
  std::vector<ExpertStack> stacks_;
  std::vector<AttentionModule> attentions_;
  std::vector<LinearAttentionModule> linear_attns_;
  std::vector<NormModule> norms_;
  std::vector<OtherModule> others_;
  std::unordered_map<std::string, size_t> linear_index_, stack_index_, attention_index_,
      norm_index_, other_index_;
};

}  // namespace qparity
