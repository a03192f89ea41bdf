// Mistral (MistralForCausalLM): Llama's blocks with a sliding-window causal mask when the config
// sets sliding_window (attention.h: a query sees the window's most recent positions, its own
// included); no q/k norms, no experts, no biases.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks mistral_blocks(const ModelConfig& cfg) {
  if (cfg.has_qk_norm) throw Error("config.json", "MistralForCausalLM has no q/k norms");
  if (cfg.is_moe()) throw Error("config.json", "MistralForCausalLM has no experts");
  if (cfg.has_qkv_bias() || cfg.mlp_bias)
    throw Error("config.json", "MistralForCausalLM has no linear biases");
  return {false, false};
}

}  // namespace qparity::reference
