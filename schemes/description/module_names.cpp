#include "schemes/description/module_names.h"

namespace qparity {

std::string_view to_string(LinearKind k) {
  switch (k) {
    case LinearKind::kQProj:
      return "q_proj";
    case LinearKind::kKProj:
      return "k_proj";
    case LinearKind::kVProj:
      return "v_proj";
    case LinearKind::kOProj:
      return "o_proj";
    case LinearKind::kGateProj:
      return "gate_proj";
    case LinearKind::kUpProj:
      return "up_proj";
    case LinearKind::kDownProj:
      return "down_proj";
    case LinearKind::kRouter:
      return "router";
    case LinearKind::kExpertGate:
      return "expert_gate_proj";
    case LinearKind::kExpertUp:
      return "expert_up_proj";
    case LinearKind::kExpertDown:
      return "expert_down_proj";
    case LinearKind::kLmHead:
      return "lm_head";
    case LinearKind::kLinearAttnQkv:
      return "in_proj_qkv";
    case LinearKind::kLinearAttnZ:
      return "in_proj_z";
    case LinearKind::kLinearAttnB:
      return "in_proj_b";
    case LinearKind::kLinearAttnA:
      return "in_proj_a";
    case LinearKind::kLinearAttnOut:
      return "linear_attn_out_proj";
  }
  return "?";
}

std::string_view to_string(ExpertShard s) {
  switch (s) {
    case ExpertShard::kNone:
      return "";
    case ExpertShard::kW1:
      return "w1";
    case ExpertShard::kW3:
      return "w3";
    case ExpertShard::kW2:
      return "w2";
  }
  return "?";
}

ModuleNames::ModuleNames(const ModelConfig& cfg) {
  const std::string cls(arch_class_prefix(cfg.arch));
  const std::string norm_cls = cls + "RMSNorm";

  auto add_linear = [&](std::string prefix, LinearKind kind, int64_t layer, int64_t n, int64_t k) {
    LinearModule m{std::move(prefix),  "Linear", kind, layer, -1,
                   ExpertShard::kNone, "",       n,    k,     false};
    linears_.push_back(std::move(m));
    return &linears_.back();
  };
  auto add_norm = [&](std::string prefix, NormKind kind, int64_t layer, int64_t dim,
                      std::vector<std::string> consumers) {
    const bool gated = kind == NormKind::kLinearAttnNorm;
    norms_.push_back({std::move(prefix), kind, layer, dim, gated ? norm_cls + "Gated" : norm_cls,
                      cfg.zero_centred_norms && !gated, std::move(consumers)});
  };
  auto add_other = [&](std::string prefix, std::string class_name) {
    others_.push_back({std::move(prefix), std::move(class_name)});
  };

  add_other("model", cls + "Model");
  add_other(std::string(kEmbedding), "Embedding");
  add_other("model.layers", "ModuleList");
  add_other("model.rotary_emb", cls + "RotaryEmbedding");

  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    const std::string attn = layer + ".self_attn";
    const std::string mlp = layer + ".mlp";
    add_other(layer, cls + "DecoderLayer");

    if (cfg.is_linear_attention_layer(i)) {
      const std::string la = layer + ".linear_attn";
      const LinearAttentionDims& d = cfg.linear;
      std::vector<std::string> in_projs;
      for (const char* p : {".in_proj_qkv", ".in_proj_z", ".in_proj_b", ".in_proj_a"})
        in_projs.push_back(la + p);
      add_norm(layer + ".input_layernorm", NormKind::kInputLayernorm, i, cfg.hidden, in_projs);
      add_other(la, cls + "GatedDeltaNet");
      add_other(la + ".conv1d", "Conv1d");
      linear_attns_.push_back({la, i, d});
      add_linear(in_projs[0], LinearKind::kLinearAttnQkv, i, d.conv_dim(), cfg.hidden);
      add_linear(in_projs[1], LinearKind::kLinearAttnZ, i, d.value_dim(), cfg.hidden);
      add_linear(in_projs[2], LinearKind::kLinearAttnB, i, d.num_value_heads, cfg.hidden);
      add_linear(in_projs[3], LinearKind::kLinearAttnA, i, d.num_value_heads, cfg.hidden);
      add_norm(la + ".norm", NormKind::kLinearAttnNorm, i, d.value_head_dim, {});
      add_linear(la + ".out_proj", LinearKind::kLinearAttnOut, i, cfg.hidden, d.value_dim());
    } else {
      add_norm(layer + ".input_layernorm", NormKind::kInputLayernorm, i, cfg.hidden,
               {attn + ".q_proj", attn + ".k_proj", attn + ".v_proj"});
      add_linear(attn + ".q_proj", LinearKind::kQProj, i, cfg.q_proj_size(), cfg.hidden);
      add_linear(attn + ".k_proj", LinearKind::kKProj, i, cfg.kv_size(), cfg.hidden);
      add_linear(attn + ".v_proj", LinearKind::kVProj, i, cfg.kv_size(), cfg.hidden);
      if (cfg.has_qk_norm) {
        add_norm(attn + ".q_norm", NormKind::kQNorm, i, cfg.head_dim, {});
        add_norm(attn + ".k_norm", NormKind::kKNorm, i, cfg.head_dim, {});
      }
      attentions_.push_back({attn, i, cfg.num_kv_heads, cfg.head_dim, cls + "Attention"});
      add_linear(attn + ".o_proj", LinearKind::kOProj, i, cfg.hidden, cfg.q_size());
    }

    if (cfg.is_moe_layer(i)) {
      const std::string stack = mlp + ".experts";
      // gpt-oss names its router mlp.router; Qwen3-MoE mlp.gate.
      const std::string router = mlp + (cfg.router_bias ? ".router" : ".gate");
      std::vector<std::string> consumers = {router};
      for (int64_t e = 0; e < cfg.num_experts; ++e) {
        const std::string ep = stack + "." + std::to_string(e);
        consumers.push_back(ep + ".gate_proj");
        consumers.push_back(ep + ".up_proj");
      }
      add_norm(layer + ".post_attention_layernorm", NormKind::kPostAttentionLayernorm, i,
               cfg.hidden, std::move(consumers));
      add_other(mlp, cfg.router_bias ? cls + "MLP" : "Qwen3MoeSparseMoeBlock");
      add_linear(router, LinearKind::kRouter, i, cfg.num_experts, cfg.hidden);
      stacks_.push_back({stack, i, cfg.num_experts, cfg.hidden, cfg.moe_intermediate_size,
                         cfg.router_bias ? cls + "Experts" : "ModuleList"});
      const int64_t inter = cfg.moe_intermediate_size;
      for (int64_t e = 0; e < cfg.num_experts; ++e) {
        const std::string ep = stack + "." + std::to_string(e);
        add_other(ep, cls + "MLP");
        struct Shard {
          const char* name;
          LinearKind kind;
          ExpertShard shard;
          int64_t n, k;
        };
        const Shard shards[] = {
            {".gate_proj", LinearKind::kExpertGate, ExpertShard::kW1, inter, cfg.hidden},
            {".up_proj", LinearKind::kExpertUp, ExpertShard::kW3, inter, cfg.hidden},
            {".down_proj", LinearKind::kExpertDown, ExpertShard::kW2, cfg.hidden, inter}};
        for (const Shard& s : shards) {
          LinearModule* m = add_linear(ep + s.name, s.kind, i, s.n, s.k);
          m->expert = e;
          m->shard = s.shard;
          m->stack = stack;
        }
      }
    } else {
      add_norm(layer + ".post_attention_layernorm", NormKind::kPostAttentionLayernorm, i,
               cfg.hidden, {mlp + ".gate_proj", mlp + ".up_proj"});
      add_other(mlp, cls + "MLP");
      add_linear(mlp + ".gate_proj", LinearKind::kGateProj, i, cfg.intermediate, cfg.hidden);
      add_linear(mlp + ".up_proj", LinearKind::kUpProj, i, cfg.intermediate, cfg.hidden);
      add_linear(mlp + ".down_proj", LinearKind::kDownProj, i, cfg.hidden, cfg.intermediate);
    }
  }
  add_norm("model.norm", NormKind::kFinal, -1, cfg.hidden, {"lm_head"});
  add_linear("lm_head", LinearKind::kLmHead, -1, cfg.vocab, cfg.hidden)->tied =
      cfg.tie_word_embeddings;

  for (size_t i = 0; i < linears_.size(); ++i)
    linear_index_.emplace(linears_[i].prefix, i);
  for (size_t i = 0; i < stacks_.size(); ++i)
    stack_index_.emplace(stacks_[i].prefix, i);
  for (size_t i = 0; i < attentions_.size(); ++i)
    attention_index_.emplace(attentions_[i].prefix, i);
  for (size_t i = 0; i < norms_.size(); ++i)
    norm_index_.emplace(norms_[i].prefix, i);
  for (size_t i = 0; i < others_.size(); ++i)
    other_index_.emplace(others_[i].prefix, i);
}

namespace {
template <typename T>
const T* lookup(const std::unordered_map<std::string, size_t>& index, const std::vector<T>& v,
                std::string_view prefix) {
  auto it = index.find(std::string(prefix));
  return it == index.end() ? nullptr : &v[it->second];
}
}  // namespace

const LinearModule* ModuleNames::find_linear(std::string_view prefix) const {
  return lookup(linear_index_, linears_, prefix);
}
const ExpertStack* ModuleNames::find_stack(std::string_view prefix) const {
  return lookup(stack_index_, stacks_, prefix);
}
const AttentionModule* ModuleNames::find_attention(std::string_view prefix) const {
  return lookup(attention_index_, attentions_, prefix);
}
const NormModule* ModuleNames::find_norm(std::string_view prefix) const {
  return lookup(norm_index_, norms_, prefix);
}
bool ModuleNames::contains(std::string_view prefix) const {
  return find_linear(prefix) || find_stack(prefix) || find_attention(prefix) || find_norm(prefix) ||
         lookup(other_index_, others_, prefix);
}

}  // namespace qparity
