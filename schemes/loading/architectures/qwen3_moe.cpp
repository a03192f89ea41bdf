// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention; layer i is a sparse MoE block (softmax
// router, top-k, optional renormalisation, experts as SwiGLU MLPs) when cfg.is_moe_layer(i), else
// a dense MLP of intermediate_size (mlp_only_layers / decoder_sparse_step).
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks qwen3_moe_blocks(const ModelConfig& cfg) {
  if (!cfg.is_moe() || cfg.num_experts_per_tok <= 0 || cfg.moe_intermediate_size <= 0)
    throw Error("config.json",
                "Qwen3MoeForCausalLM needs num_experts, num_experts_per_tok and "
                "moe_intermediate_size > 0");
  if (cfg.num_experts_per_tok > cfg.num_experts)
    throw Error("config.json", "num_experts_per_tok exceeds num_experts");
  return {true, true};
}

}  // namespace qparity::reference
