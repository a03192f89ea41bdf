#include "core/safetensors/language_model_names.h"

#include <set>

#include "core/error.h"

namespace qparity {

std::string language_model_canonical_name(const ModelConfig& cfg, const std::string& name) {
  if (!cfg.image_text || !name.starts_with(kLanguageModelPrefix)) return name;
  return "model." + name.substr(kLanguageModelPrefix.size());
}

std::string language_model_checkpoint_name(const ModelConfig& cfg, const std::string& name) {
  if (!cfg.image_text || !name.starts_with("model.") || name.starts_with("model.visual."))
    return name;
  return std::string(kLanguageModelPrefix) + name.substr(6);
}

bool is_unused_by_text(const ModelConfig& cfg, const std::string& name) {
  if (cfg.image_text && name.starts_with("model.visual.")) return true;
  return cfg.arch == Arch::kQwen3_5 && name.starts_with("mtp.");
}

Checkpoint language_model_view(Checkpoint raw, const ModelConfig& cfg) {
  if (!cfg.image_text) return raw;
  std::vector<Checkpoint::ViewTensor> view;
  std::set<std::string> seen;
  for (const auto& [name, ref] : raw.tensors()) {
    const std::string canonical = language_model_canonical_name(cfg, name);
    if (!seen.insert(canonical).second)
      throw Error(raw.root().string() + ": tensor '" + name + "'",
                  "is '" + canonical + "' of the language model, which the checkpoint holds twice");
    view.push_back({canonical, name, 0, 0});
  }
  return Checkpoint::renamed(std::move(raw), view);
}

}  // namespace qparity
