// Qwen3-VL's text decoder (Qwen3VLForConditionalGeneration's language model, Qwen3VLText*
// classes): Qwen3's blocks (standard RMSNorm, per-head q/k norms, no gate). Text-only input:
// the interleaved M-RoPE gives its three position rows equal values, so its per-channel
// frequencies are the 1-D ones over the whole head. The vision tower is not run (its tensors are
// skipped by name, language_model_names.h); image input is not implemented.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks qwen3_vl_blocks(const ModelConfig& cfg) {
  if (cfg.is_moe())
    throw Error("config.json", "Qwen3-VL-MoE's experts are not implemented by the reference");
  return {true, false};
}

}  // namespace qparity::reference
