// Qwen3 (Qwen3ForCausalLM): Llama's blocks plus a per-head RMSNorm on q and k before RoPE
// (q_norm / k_norm over head_dim), with head_dim given explicitly in config.json.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks qwen3_blocks(const ModelConfig& cfg) {
  if (cfg.is_moe()) throw Error("config.json", "Qwen3ForCausalLM has no experts (num_experts)");
  return {true, false};
}

}  // namespace qparity::reference
