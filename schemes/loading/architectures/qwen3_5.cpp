// Qwen3.5 text (Qwen3_5ForCausalLM): Qwen3's blocks (per-head q/k norms) with hybrid token
// mixers: layers marked linear_attention run the Gated DeltaNet (gated_delta_net.h), the others
// gated full attention (q_proj gives [q | gate] per head; the attention output times
// sigmoid(gate) feeds o_proj) with partial RoPE; every RMSNorm but the Gated DeltaNet's is
// zero-centred (x̂ * (1 + w)). Dense MLPs only (Qwen3.5-MoE is its own class, not implemented).
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks qwen3_5_blocks(const ModelConfig& cfg) {
  if (cfg.is_moe()) throw Error("config.json", "Qwen3_5ForCausalLM has no experts");
  if (cfg.has_qkv_bias() || cfg.mlp_bias)
    throw Error("config.json", "Qwen3_5ForCausalLM with linear biases is not implemented");
  if (static_cast<int64_t>(cfg.layer_types.size()) != cfg.num_layers)
    throw Error("config.json", "Qwen3_5ForCausalLM needs a token mixer per layer (layer_types)");
  return {true, false};
}

}  // namespace qparity::reference
