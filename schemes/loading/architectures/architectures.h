#pragma once
// The architectures as flags over the shared blocks of a decoder layer (layer_weights.h), one file
// each: llama.cpp, qwen3.cpp, qwen3_moe.cpp, mistral.cpp, chatglm2.cpp, qwen3_5.cpp, qwen3_vl.cpp,
// gpt_oss.cpp.
// Here, beside the loader, because the flags decide which weights a layer has; both engines
// compose the same blocks (reference_cpu/models/causal_lm.h, gpu_engine/decoder.h). Each checks
// that the config has what its Hugging Face class computes and nothing it does not (a Llama with
// q/k norms or experts is refused by name).
#include "core/config/model_config.h"

namespace qparity::reference {

struct ArchBlocks {
  bool qk_norm = false;  // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool moe = false;      // sparse MoE layers where cfg.is_moe_layer(i) (Qwen3-MoE)
};

ArchBlocks llama_blocks(const ModelConfig& cfg);
ArchBlocks qwen3_blocks(const ModelConfig& cfg);
ArchBlocks qwen3_moe_blocks(const ModelConfig& cfg);
ArchBlocks mistral_blocks(const ModelConfig& cfg);
ArchBlocks chatglm2_blocks(const ModelConfig& cfg);
ArchBlocks qwen3_5_blocks(const ModelConfig& cfg);
ArchBlocks qwen3_vl_blocks(const ModelConfig& cfg);
ArchBlocks gpt_oss_blocks(const ModelConfig& cfg);
// Dispatches on cfg.arch (a switch with no default: a new Arch is a compile error here).
ArchBlocks blocks_of(const ModelConfig& cfg);

}  // namespace qparity::reference
