#include "schemes/loading/linear_layers.h"

#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

std::vector<LinearLayer> linear_layers(const ModelConfig& cfg, DType model_dtype,
                                       std::optional<DType> run_dtype) {
  const ArchBlocks blocks = blocks_of(cfg);
  std::vector<LinearLayer> out;
  auto add = [&](LinearLayerKind kind, int64_t layer, const std::string& prefix,
                 std::vector<std::string> names, std::vector<int64_t> rows, int64_t k, bool bias,
                 const std::string& fused) {
    LinearLayer ll;
    ll.kind = kind;
    ll.layer = layer;
    ll.shape.prefix = prefix;
    ll.shape.partitions = std::move(rows);
    ll.shape.in_features = k;
    ll.shape.model_dtype = model_dtype;
    ll.shape.run_dtype = run_dtype;
    ll.shape.has_bias = bias;
    if (names.empty()) {  // one unfused module: the prefix itself
      ll.members.push_back({prefix, 0, 0});
    } else {
      for (size_t p = 0; p < names.size(); ++p)
        ll.members.push_back({prefix + "." + names[p], static_cast<int64_t>(p), 0});
      ll.shape.partition_names = std::move(names);
    }
    ll.plan_entry = ll.members.front().module;
    if (!fused.empty()) ll.fused_module = prefix + "." + fused;
    out.push_back(std::move(ll));
  };
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string lp = "model.layers." + std::to_string(i);
    const std::string attn = lp + ".self_attn", mlp = lp + ".mlp";
    if (cfg.is_linear_attention_layer(i)) {
      // No fused checkpoint names: Qwen3-Next's in_proj_qkvz / in_proj_ba interleave the heads
      // by key-head group, a layout this reference does not read (refused as unexpected).
      const LinearAttentionDims& d = cfg.linear;
      const std::string la = lp + ".linear_attn";
      add(LinearLayerKind::kLinearAttnQkvz, i, la, {"in_proj_qkv", "in_proj_z"},
          {d.conv_dim(), d.value_dim()}, cfg.hidden, false, "");
      add(LinearLayerKind::kLinearAttnBa, i, la, {"in_proj_b", "in_proj_a"},
          {d.num_value_heads, d.num_value_heads}, cfg.hidden, false, "");
      add(LinearLayerKind::kLinearAttnOut, i, la + ".out_proj", {}, {cfg.hidden}, d.value_dim(),
          false, "");
    } else {
      add(LinearLayerKind::kQkv, i, attn, {"q_proj", "k_proj", "v_proj"},
          {cfg.q_proj_size(), cfg.kv_size(), cfg.kv_size()}, cfg.hidden, cfg.has_qkv_bias(),
          "qkv_proj");
      add(LinearLayerKind::kOProj, i, attn + ".o_proj", {}, {cfg.hidden}, cfg.q_size(),
          cfg.attention_bias, "");
    }
    if (!(blocks.moe && cfg.is_moe_layer(i))) {
      add(LinearLayerKind::kGateUp, i, mlp, {"gate_proj", "up_proj"},
          {cfg.intermediate, cfg.intermediate}, cfg.hidden, cfg.mlp_bias, "gate_up_proj");
      add(LinearLayerKind::kDown, i, mlp + ".down_proj", {}, {cfg.hidden}, cfg.intermediate,
          cfg.mlp_bias, "");
      continue;
    }
    // gpt-oss names its router mlp.router (with a bias); Qwen3-MoE mlp.gate.
    add(LinearLayerKind::kRouter, i, mlp + (cfg.router_bias ? ".router" : ".gate"), {},
        {cfg.num_experts}, cfg.hidden, cfg.router_bias, "");
    const std::string stack = mlp + ".experts";
    const int64_t e = cfg.num_experts, im = cfg.moe_intermediate_size;
    for (const bool w13 : {true, false}) {
      LinearLayer ll;
      ll.kind = w13 ? LinearLayerKind::kExpertsW13 : LinearLayerKind::kExpertsW2;
      ll.layer = i;
      ll.shape.prefix = stack;
      ll.shape.partition_names = w13 ? std::vector<std::string>{"gate_proj", "up_proj"}
                                     : std::vector<std::string>{"down_proj"};
      ll.shape.partitions = w13 ? std::vector<int64_t>{im, im} : std::vector<int64_t>{cfg.hidden};
      ll.shape.in_features = w13 ? cfg.hidden : im;
      ll.shape.num_experts = e;
      ll.shape.has_bias = cfg.expert_bias;
      ll.shape.model_dtype = model_dtype;
      ll.shape.run_dtype = run_dtype;
      for (int64_t x = 0; x < e; ++x)
        for (size_t p = 0; p < ll.shape.partition_names.size(); ++p)
          ll.members.push_back({stack + "." + std::to_string(x) + "." + ll.shape.partition_names[p],
                                static_cast<int64_t>(p), x});
      ll.plan_entry = stack;
      out.push_back(std::move(ll));
    }
  }
  add(LinearLayerKind::kLmHead, -1, "lm_head", {}, {cfg.vocab}, cfg.hidden, false, "");
  return out;
}

}  // namespace qparity::reference
