#pragma once
// An image-text checkpoint's language model (Qwen3_5ForConditionalGeneration,
// Qwen3VLForConditionalGeneration: ModelConfig::image_text) seen under the canonical names every
// other part of qparity reads, and back for writers:
//
//   model.language_model.<rest>    model.<rest>          (embed_tokens, layers, norm)
//   lm_head.*, model.visual.*, mtp.*                     unchanged
//
// The vision tower (model.visual.*) and Qwen3.5's multi-token-prediction head (mtp.*) stay in the
// view under their own names: the reference's text path skips them by name (is_unused_by_text),
// and the quantizer copies them through, as llm-compressor leaves them. Nothing is copied (the
// view reads the mapped bytes, Checkpoint::renamed).
#include <string>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"

namespace qparity {

inline constexpr std::string_view kLanguageModelPrefix = "model.language_model.";

// The canonical name of a checkpoint tensor or module name ("model.language_model.layers.0..." ->
// "model.layers.0..."); other names unchanged. Identity unless cfg.image_text.
std::string language_model_canonical_name(const ModelConfig& cfg, const std::string& name);
// The checkpoint name of a canonical one ("model.layers.0..." -> "model.language_model.layers.0
// ..."; lm_head, model.visual.*, mtp.* unchanged). Identity unless cfg.image_text.
std::string language_model_checkpoint_name(const ModelConfig& cfg, const std::string& name);
// Whether a (canonical) tensor name belongs to what the text path does not run: the vision tower
// of an image-text checkpoint, Qwen3.5's mtp head.
bool is_unused_by_text(const ModelConfig& cfg, const std::string& name);

// `raw` under canonical names (identity unless cfg.image_text). A canonical name given twice
// (model.embed_tokens.weight beside model.language_model.embed_tokens.weight) is an Error.
Checkpoint language_model_view(Checkpoint raw, const ModelConfig& cfg);

}  // namespace qparity
