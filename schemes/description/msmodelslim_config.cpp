#include "schemes/description/msmodelslim_config.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/safetensors/chatglm_names.h"
#include "core/safetensors/language_model_names.h"

namespace qparity {

namespace {

// Global keys of the description (everything else names a tensor).
const std::set<std::string> kGlobalKeys = {"model_quant_type",  "version",
                                           "group_size",        "kv_cache_type",
                                           "kv_quant_type",     "fa_quant_type",
                                           "reduce_quant_type", "metadata",
                                           "optional",          "model_quant_type_second"};

struct LinearType {
  const char* type;
  std::vector<std::string> required;  // besides "weight"
  std::vector<std::string> optional;  // besides "bias" (type FLOAT)
};

const std::vector<LinearType>& linear_types() {
  static const std::vector<LinearType> t = {
      {"FLOAT", {}, {}},
      {"W8A16", {"weight_scale", "weight_offset"}, {}},
      {"W8A8",
       {"input_scale", "input_offset", "deq_scale", "quant_bias"},
       {"weight_scale", "weight_offset"}},
      {"W8A8S",
       {"input_scale", "input_offset", "deq_scale", "quant_bias"},
       {"weight_scale", "weight_offset"}},
      {"W8A8_DYNAMIC", {"weight_scale"}, {"weight_offset"}},
      {"WFP8AFP8_DYNAMIC", {"weight_scale"}, {"weight_offset"}},
      // v1 per channel (group_size 0); the per-group layout's *_second tensors are refused.
      {"W4A8_DYNAMIC", {"weight_scale", "scale_bias"}, {"weight_offset"}},
  };
  return t;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_known_type(const std::string& t) {
  const auto& known = msmodelslim_known_types();
  if (std::find(known.begin(), known.end(), t) != known.end()) return true;
  // Families written with a suffix by the FlatQuant / SVD wrappers.
  return ends_with(t, "_FLATQUANT") || ends_with(t, "_FLATQUANT_DYNAMIC") || ends_with(t, "_SVD");
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string supported_list() {
  return join(msmodelslim_supported_types()) + " and C8 KV caches";
}

// Entries grouped by the module they belong to: prefix -> (suffix -> type), in file order.
struct ModuleEntries {
  std::vector<std::pair<std::string, std::string>> items;
  const std::string* find(const std::string& suffix) const {
    for (const auto& [s, t] : items)
      if (s == suffix) return &t;
    return nullptr;
  }
};

}  // namespace

const std::vector<std::string>& msmodelslim_supported_types() {
  static const std::vector<std::string> t = {
      "FLOAT", "W8A16", "W8A8", "W8A8S", "W8A8_DYNAMIC", "WFP8AFP8_DYNAMIC", "W4A8_DYNAMIC"};
  return t;
}

const std::vector<std::string>& msmodelslim_known_types() {
  static const std::vector<std::string> t = {"FLOAT",          "W16A16S",
                                             "W16A16SC",       "W8A16",
                                             "W8A8_DYNAMIC",   "W8A8_MIX",
                                             "W8A8",           "W8A8S",
                                             "W8A8SC",         "WFP8AFP8_DYNAMIC",
                                             "W8A8_MXFP8",     "W4A8_MXFP",
                                             "W4A8_DYNAMIC",   "W4A4_DYNAMIC",
                                             "W4A4_MXFP4",     "W4A4_MXFP4_DUALSCALE",
                                             "W4A4_MXFP4_SVD", "C8",
                                             "FAQuant",        "FAKQuant"};
  return t;
}

QuantPlan plan_from_msmodelslim(const ModelConfig& cfg, const Json& raw_desc,
                                const std::string& where) {
  require_object(raw_desc, where);
  // ChatGLM2's keys name its fused modules: each key stands for the canonical names it covers.
  // An image-text model's keys name its language model's tensors under model.language_model.*.
  Json desc =
      cfg.arch == Arch::kChatGlm2 ? chatglm2_canonical_description(raw_desc, cfg, where) : raw_desc;
  if (cfg.image_text) {
    Json canonical = Json::object();
    for (const auto& [k, v] : desc.items())
      canonical[language_model_canonical_name(cfg, k)] = v;
    desc = std::move(canonical);
  }
  auto key = [&](const std::string& k) { return key_where(where, k); };

  // --- global keys ---
  const int64_t group_size = opt_int(desc, "group_size", where).value_or(0);
  if (group_size < 0)
    throw Error(key("group_size"), "must be >= 0, got " + std::to_string(group_size));
  opt_string(desc, "model_quant_type", where);  // informative only; type-checked
  const std::optional<std::string> version = opt_string(desc, "version", where);
  bool any_w4a8 = false;
  bool kv_c8 = false;
  for (const char* k : {"kv_cache_type", "kv_quant_type"}) {
    auto v = opt_string(desc, k, where);
    if (!v || v->empty() || *v == "FLOAT") continue;
    if (*v == "C8" || *v == "KV8")  // the v1 doc example writes "KV8" for kv_quant_type
      kv_c8 = true;
    else
      throw Error(key(k), "KV cache type '" + *v + "' is not supported (supported: C8)");
  }
  if (auto v = opt_string(desc, "fa_quant_type", where); v && !v->empty() && *v != "FLOAT")
    throw Error(key("fa_quant_type"),
                "'" + *v + "': quantized attention (FA) is not implemented by qparity");
  if (auto v = opt_string(desc, "reduce_quant_type", where); v && !v->empty() && *v != "FLOAT")
    throw Error(key("reduce_quant_type"),
                "'" + *v + "': quantized communication is not implemented by qparity");
  if (auto it = desc.find("metadata"); it != desc.end() && !it->is_null()) {
    require_object(*it, key("metadata"));
    if (it->contains("quarot"))
      throw Error(key("metadata.quarot"), "QuaRot online rotation is not implemented by qparity");
  }

  QuantPlan plan(cfg, Provenance{PlanSource::kMsModelSlim, where, "", "", "", ""});
  plan.set_source(PlanSource::kMsModelSlim, where);
  const ModuleNames& mods = plan.modules();

  // --- group tensor entries by module: the longest module prefix of each key wins ---
  std::map<std::string, ModuleEntries> by_module;
  for (const auto& [k, v] : desc.items()) {
    if (kGlobalKeys.count(k)) continue;
    if (!v.is_string())
      throw Error(key(k), "expected a quant type string, got " + json_type_name(v));
    const std::string type = v.get<std::string>();
    std::string prefix, suffix;
    // Only modules that own tensors qualify; containers ("model.layers.0") have none.
    auto owns_tensors = [&](std::string_view m) {
      return mods.find_linear(m) || mods.find_norm(m) || mods.find_attention(m) ||
             m == ModuleNames::kEmbedding;
    };
    for (size_t p = k.rfind('.'); p != std::string::npos && p > 0; p = k.rfind('.', p - 1)) {
      if (owns_tensors(std::string_view(k).substr(0, p))) {
        prefix = k.substr(0, p);
        suffix = k.substr(p + 1);
        break;
      }
    }
    if (prefix.empty()) {
      if (type == "FAQuant" || type == "FAKQuant")
        throw Error(key(k),
                    "'" + type + "': quantized attention (FA) is not implemented by qparity");
      throw Error(key(k), "names no tensor of a module of this " + cfg.arch_name + " model");
    }
    by_module[prefix].items.emplace_back(suffix, type);
  }
  auto entries_of = [&](const std::string& prefix) -> const ModuleEntries* {
    auto it = by_module.find(prefix);
    return it == by_module.end() ? nullptr : &it->second;
  };
  auto unknown_tensor = [&](const std::string& prefix, const std::string& suffix,
                            const std::string& what) {
    throw Error(key(prefix + "." + suffix), "'" + suffix + "' is not a tensor of " + what);
  };

  // --- linears ---
  std::map<std::string, std::map<std::string, std::string>> kv_entries;  // attn -> name -> type
  for (const LinearModule& m : mods.linears()) {
    const ModuleEntries* me = entries_of(m.prefix);
    const std::string* wt = me ? me->find("weight") : nullptr;
    if (!wt) {
      if (m.tied) continue;  // lm_head shares model.embed_tokens.weight
      throw Error(where,
                  "missing entry '" + m.prefix + ".weight' (every module of the model needs one)");
    }
    const std::string wkey = m.prefix + ".weight";
    if (*wt == "W8A8SC")
      throw Error(key(wkey),
                  "W8A8SC weights are compressed by msModelSlim's closed native tool "
                  "(compress_excutor) and cannot be reproduced; use the uncompressed "
                  "W8A8S checkpoint instead");
    const LinearType* lt = nullptr;
    for (const LinearType& t : linear_types())
      if (*wt == t.type) lt = &t;
    if (!lt) {
      if (is_known_type(*wt))
        throw Error(key(wkey), "quant type '" + *wt + "' is not supported by qparity (supported: " +
                                   supported_list() + ")");
      throw Error(key(wkey), "unknown msModelSlim quant type '" + *wt + "'");
    }
    const std::string type = lt->type;

    for (const auto& [suffix, t] : me->items) {
      if (suffix == "weight") continue;
      if (suffix == "kv_cache_scale" || suffix == "kv_cache_offset") {
        const bool kv_proj = m.kind == LinearKind::kKProj || m.kind == LinearKind::kVProj;
        if (!kv_proj)
          unknown_tensor(m.prefix, suffix, "this linear (C8 entries sit on k_proj and v_proj)");
        if (t != "C8")
          throw Error(key(m.prefix + "." + suffix), "expected type C8, got '" + t + "'");
        const std::string attn = m.prefix.substr(0, m.prefix.rfind('.'));
        kv_entries[attn][m.prefix.substr(attn.size() + 1) + "." + suffix] = t;
        continue;
      }
      if (suffix == "div.mul_scale" || suffix.rfind("linear.", 0) == 0)
        throw Error(key(m.prefix + "." + suffix),
                    "non-fusable anti-outlier smoothing (div.mul_scale / .linear) is not "
                    "implemented by qparity");
      if (type == "W4A8_DYNAMIC" &&
          (suffix == "weight_scale_second" || suffix == "weight_offset_second"))
        throw Error(key(m.prefix + "." + suffix),
                    "W4A8_DYNAMIC with per-group two-level scales (weight_scale_second / "
                    "weight_offset_second: msModelSlim v0 or group_size > 0) is not implemented by "
                    "the qparity reference; only the v1 per-channel layout (group_size 0) is");
      if (suffix == "bias") {
        if (t != "FLOAT")
          throw Error(key(m.prefix + ".bias"), "expected type FLOAT, got '" + t + "'");
        continue;
      }
      const bool listed =
          std::find(lt->required.begin(), lt->required.end(), suffix) != lt->required.end() ||
          std::find(lt->optional.begin(), lt->optional.end(), suffix) != lt->optional.end();
      if (!listed) {
        std::vector<std::string> expected = {"weight"};
        expected.insert(expected.end(), lt->required.begin(), lt->required.end());
        expected.insert(expected.end(), lt->optional.begin(), lt->optional.end());
        expected.push_back("bias");
        unknown_tensor(m.prefix, suffix, "a " + type + " linear (expected " + join(expected) + ")");
      }
      if (t != type)
        throw Error(key(m.prefix + "." + suffix),
                    "type '" + t + "' differs from the layer's weight type '" + type + "'");
    }
    for (const std::string& r : lt->required)
      if (!me->find(r))
        throw Error(where, "missing entry '" + m.prefix + "." + r + "' of a " + type + " linear");

    SchemeId scheme{SchemeKind::kBf16, 0};
    if (type == "W8A16")
      scheme = group_size > 0 ? SchemeId{SchemeKind::kW8A16Group, group_size}
                              : SchemeId{SchemeKind::kW8A16Channel, 0};
    else if (type == "W8A8")
      scheme = {SchemeKind::kW8A8Static, 0};
    else if (type == "W8A8S")
      scheme = {SchemeKind::kW8A8S, 0};
    else if (type == "W8A8_DYNAMIC")
      scheme = {SchemeKind::kW8A8Int8, 0};
    else if (type == "WFP8AFP8_DYNAMIC")
      scheme = {SchemeKind::kFp8Channel, 0};
    else if (type == "W4A8_DYNAMIC")
      scheme = {SchemeKind::kW4A8Dyn, 0};
    if (scheme.kind == SchemeKind::kW4A8Dyn && group_size > 0)
      throw Error(key(wkey), "W4A8_DYNAMIC with group_size " + std::to_string(group_size) +
                                 " (the per-group two-level layout) is not implemented by the "
                                 "qparity reference; only per channel (group_size 0) is");
    if (scheme.kind == SchemeKind::kW8A8Int8 && group_size > 0)
      throw Error(key(wkey), "W8A8_DYNAMIC with group_size " + std::to_string(group_size) +
                                 " (per-group weight scales) is not implemented by qparity");

    if (scheme.kind == SchemeKind::kW4A8Dyn) {
      // vllm-ascend before methods/w4a8 and SGLang read version != "1.0.0" as the older layout
      // (one unpacked int4 per byte, per-group two-level scales); current vllm-ascend reads only
      // the packed v1 layout, whatever the version says.
      if (version && *version != "1.0.0")
        throw Error(key("version"),
                    "'" + *version + "' with W4A8_DYNAMIC entries ('" + wkey +
                        "'): the pre-1.0.0 unpacked W4A8 layout is not "
                        "implemented by the qparity reference (only version 1.0.0)");
      any_w4a8 = true;
    }

    PlanEntry& e = plan.mutable_entry(m.prefix);
    e.scheme = scheme;
    if (e.quantized()) {
      const ImpliedArgs a = implied_args(scheme);
      e.weights = a.weights;
      e.input_activations = a.input_activations;
      e.format = "msmodelslim";
    }
    e.source_type = type;
    e.why.key = wkey;
    e.why.note = "type " + type;
  }

  // --- norms: plain, or anti-outlier (scaled weight + new bias) ---
  for (const NormModule& n : mods.norms()) {
    const ModuleEntries* me = entries_of(n.prefix);
    if (!me || (!me->find("weight") && !me->find("module.weight")))
      throw Error(where,
                  "missing entry '" + n.prefix + ".weight' (every module of the model needs one)");
    bool smooth = false;
    std::string decided;
    for (const auto& [suffix, t] : me->items) {
      if (suffix != "weight" && suffix != "bias" && suffix != "module.weight" &&
          suffix != "module.bias")
        unknown_tensor(n.prefix, suffix,
                       "a norm (expected weight, bias, module.weight, module.bias)");
      if (t != "FLOAT")
        throw Error(key(n.prefix + "." + suffix), "expected type FLOAT, got '" + t + "'");
      if (suffix != "weight") {
        smooth = true;
        if (decided.empty()) decided = n.prefix + "." + suffix;
      }
    }
    if (!smooth) continue;
    if (n.kind == NormKind::kQNorm || n.kind == NormKind::kKNorm)
      throw Error(key(decided), "anti-outlier folding into q_norm / k_norm is not implemented");
    PlanEntry& e = plan.mutable_entry(n.prefix);
    e.scheme = SchemeId{SchemeKind::kSmoothQuant, 0};
    e.format = "msmodelslim";
    e.source_type = "anti-outlier";
    e.why.key = decided;
    e.why.note = me->find("module.weight") ? "anti-outlier norm (old-style module.weight/bias)"
                                           : "anti-outlier norm bias";
  }

  // --- embedding, attention modules, and anything else that was named ---
  {
    const std::string emb(ModuleNames::kEmbedding);
    const ModuleEntries* me = entries_of(emb);
    if (!me || !me->find("weight"))
      throw Error(where,
                  "missing entry '" + emb + ".weight' (every module of the model needs one)");
    for (const auto& [suffix, t] : me->items) {
      if (suffix != "weight") unknown_tensor(emb, suffix, "the embedding");
      if (t != "FLOAT") throw Error(key(emb + ".weight"), "expected type FLOAT, got '" + t + "'");
    }
  }
  for (const auto& [prefix, me] : by_module) {
    if (mods.find_linear(prefix) || mods.find_norm(prefix) || prefix == ModuleNames::kEmbedding)
      continue;
    // Only attention modules are left: they own no tensor qparity reads, and `quant_type` may
    // only say FLOAT (anything else quantizes the attention computation itself).
    for (const auto& [suffix, t] : me.items) {
      if (suffix == "quant_type" && t == "FLOAT") continue;
      if (suffix == "quant_type" || t == "FAQuant" || t == "FAKQuant")
        throw Error(key(prefix + "." + suffix),
                    "'" + t + "': quantized attention (FA) is not implemented by qparity");
      unknown_tensor(prefix, suffix, "an attention module");
    }
  }

  // --- KV cache C8 ---
  const char* const kKvNames[] = {"k_proj.kv_cache_scale", "k_proj.kv_cache_offset",
                                  "v_proj.kv_cache_scale", "v_proj.kv_cache_offset"};
  bool any_c8 = false;
  for (const AttentionModule& a : mods.attentions()) {
    auto it = kv_entries.find(a.prefix);
    const size_t have = it == kv_entries.end() ? 0 : it->second.size();
    if (have == 0 && !kv_c8) continue;
    for (const char* n : kKvNames)
      if (have == 0 || !it->second.count(n))
        throw Error(where, std::string(kv_c8 ? "kv_cache_type is C8 but " : "C8 KV cache: ") +
                               "entry '" + a.prefix + "." + n + "' is missing");
    any_c8 = true;
    PlanEntry& e = plan.mutable_entry(a.prefix);
    e.scheme = SchemeId{SchemeKind::kKvInt8, 0};
    e.kv_cache = implied_args(*e.scheme).kv_cache;
    e.format = "msmodelslim";
    e.source_type = "C8";
    e.why.key = a.prefix + ".k_proj.kv_cache_scale";
    e.why.note = "C8";
  }
  if (any_w4a8 && !version)
    plan.add_warning(where +
                     ": W4A8_DYNAMIC entries without a global version; read as the v1 packed "
                     "layout (version 1.0.0), as current vllm-ascend does");
  if (any_c8 && !kv_c8)
    plan.add_warning(where + ": C8 KV-cache entries without a global kv_cache_type C8");

  plan.finalize();
  return plan;
}

}  // namespace qparity
