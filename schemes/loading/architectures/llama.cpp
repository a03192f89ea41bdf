// Llama (LlamaForCausalLM): RMSNorm, RoPE (default / linear / llama3 scaling), grouped-query
// attention, SwiGLU MLP; no q/k norms, no experts.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks llama_blocks(const ModelConfig& cfg) {
  if (cfg.has_qk_norm) throw Error("config.json", "LlamaForCausalLM has no q/k norms");
  if (cfg.is_moe()) throw Error("config.json", "LlamaForCausalLM has no experts (num_experts)");
  return {false, false};
}

}  // namespace qparity::reference
