// gpt-oss (GptOssForCausalLM, transformers models/gpt_oss/modeling_gpt_oss.py): Llama-shaped
// attention with biases on q/k/v/o and a learned sink logit per head, full and sliding-window
// layers alternating (cfg.window_of), YaRN RoPE; every layer a sparse MoE block whose router has
// a bias and takes the softmax over its top-k logits, and whose experts have biases and the
// clamped SwiGLU (cfg.swiglu_alpha, cfg.swiglu_limit). No q/k norms, no shared experts.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks gpt_oss_blocks(const ModelConfig& cfg) {
  if (!cfg.is_moe() || cfg.num_experts_per_tok <= 0 || cfg.moe_intermediate_size <= 0)
    throw Error("config.json",
                "GptOssForCausalLM needs num_local_experts, num_experts_per_tok and "
                "intermediate_size > 0");
  if (!cfg.attention_sinks || !cfg.router_bias || !cfg.expert_bias || !cfg.topk_then_softmax ||
      !(cfg.swiglu_limit > 0.0) || !(cfg.swiglu_alpha > 0.0))
    throw Error("config.json", "GptOssForCausalLM's config was not read as gpt-oss");
  if (cfg.has_qk_norm) throw Error("config.json", "GptOssForCausalLM has no q/k norms");
  if (cfg.mlp_bias) throw Error("config.json", "GptOssForCausalLM has no dense MLP");
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    if (!cfg.is_moe_layer(i))
      throw Error("config.json", "GptOssForCausalLM's layer " + std::to_string(i) +
                                     " must be a MoE layer (gpt-oss has no dense MLP)");
  return {false, true};
}

}  // namespace qparity::reference
