#include "schemes/loading/architectures/architectures.h"

#include "core/error.h"

namespace qparity::reference {

ArchBlocks blocks_of(const ModelConfig& cfg) {
  switch (cfg.arch) {
    case Arch::kLlama:
      return llama_blocks(cfg);
    case Arch::kQwen3:
      return qwen3_blocks(cfg);
    case Arch::kQwen3Moe:
      return qwen3_moe_blocks(cfg);
    case Arch::kMistral:
      return mistral_blocks(cfg);
    case Arch::kChatGlm2:
      return chatglm2_blocks(cfg);
    case Arch::kQwen3_5:
      return qwen3_5_blocks(cfg);
    case Arch::kQwen3Vl:
      return qwen3_vl_blocks(cfg);
    case Arch::kGptOss:
      return gpt_oss_blocks(cfg);
  }
  throw Error("config.json", "unknown architecture");
}

}  // namespace qparity::reference
