#include "core/safetensors/chatglm_names.h"

#include <charconv>
#include <string_view>

#include "core/error.h"
#include "core/safetensors/gpt_oss_names.h"
#include "core/safetensors/language_model_names.h"

namespace qparity {

namespace {

constexpr std::string_view kLayers = "transformer.encoder.layers.";
constexpr std::string_view kDrop = "transformer.rotary_pos_emb.inv_freq";

bool take(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// "<L>.<rest>" -> L, leaving rest in s; -1 when s does not start with a layer number.
int64_t take_layer(std::string_view& s) {
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), layer);
  if (ec != std::errc() || end == s.data() || end == s.data() + s.size() || *end != '.') return -1;
  s.remove_prefix(static_cast<size_t>(end - s.data()) + 1);
  return layer;
}

Error unknown(const std::string& name, const std::string& why) {
  return Error("tensor '" + name + "'", why);
}

}  // namespace

ChatGlmName chatglm2_canonical_name(const std::string& name, const ModelConfig& cfg) {
  std::string_view s = name;
  const std::string r(s);
  if (s == kDrop) return {};
  if (take(s, "transformer.embedding.word_embeddings."))
    return {{"model.embed_tokens." + std::string(s)}, {}};
  if (take(s, "transformer.encoder.final_layernorm."))
    return {{"model.norm." + std::string(s)}, {}};
  if (take(s, "transformer.output_layer.")) return {{"lm_head." + std::string(s)}, {}};
  if (take(s, kLayers)) {
    const int64_t layer = take_layer(s);
    if (layer < 0 || layer >= cfg.num_layers)
      throw unknown(r, "names no layer of the model's " + std::to_string(cfg.num_layers));
    const std::string lp = "model.layers." + std::to_string(layer) + ".";
    if (s.starts_with("input_layernorm.") || s.starts_with("post_attention_layernorm."))
      return {{lp + std::string(s)}, {}};
    if (take(s, "self_attention.query_key_value.")) {
      const std::string t(s);
      if (s.starts_with("k_proj.kv_cache_") || s.starts_with("v_proj.kv_cache_"))
        return {{lp + "self_attn." + t}, {}};
      return {{lp + "self_attn.q_proj." + t, lp + "self_attn.k_proj." + t,
               lp + "self_attn.v_proj." + t},
              {cfg.q_size(), cfg.kv_size(), cfg.kv_size()}};
    }
    if (take(s, "self_attention.dense.")) return {{lp + "self_attn.o_proj." + std::string(s)}, {}};
    if (take(s, "mlp.dense_h_to_4h.")) {
      const std::string t(s);
      return {{lp + "mlp.gate_proj." + t, lp + "mlp.up_proj." + t},
              {cfg.intermediate, cfg.intermediate}};
    }
    if (take(s, "mlp.dense_4h_to_h.")) return {{lp + "mlp.down_proj." + std::string(s)}, {}};
  }
  throw unknown(r,
                "is not a ChatGLM2 tensor qparity knows (transformer.embedding, "
                "transformer.encoder.layers.<L>.{input_layernorm, self_attention.query_key_value, "
                "self_attention.dense, post_attention_layernorm, mlp.dense_h_to_4h, "
                "mlp.dense_4h_to_h}, transformer.encoder.final_layernorm, "
                "transformer.output_layer, transformer.rotary_pos_emb.inv_freq)");
}

ChatGlmTarget chatglm2_target_name(const std::string& canonical, const ModelConfig& cfg) {
  std::string_view s = canonical;
  if (take(s, "model.embed_tokens."))
    return {"transformer.embedding.word_embeddings." + std::string(s)};
  if (take(s, "model.norm.")) return {"transformer.encoder.final_layernorm." + std::string(s)};
  if (take(s, "lm_head.")) return {"transformer.output_layer." + std::string(s)};
  if (take(s, "model.layers.")) {
    const int64_t layer = take_layer(s);
    if (layer >= 0 && layer < cfg.num_layers) {
      const std::string lp = std::string(kLayers) + std::to_string(layer) + ".";
      if (s.starts_with("input_layernorm.") || s.starts_with("post_attention_layernorm."))
        return {lp + std::string(s)};
      const std::string qkv = lp + "self_attention.query_key_value.";
      int64_t part = 0;
      for (const char* p : {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."}) {
        if (take(s, p)) {
          if (part > 0 && s.starts_with("kv_cache_"))
            return {qkv + (part == 1 ? "k_proj." : "v_proj.") + std::string(s)};
          return {qkv + std::string(s), part, 3};
        }
        ++part;
      }
      if (take(s, "self_attn.o_proj.")) return {lp + "self_attention.dense." + std::string(s)};
      if (take(s, "mlp.gate_proj.")) return {lp + "mlp.dense_h_to_4h." + std::string(s), 0, 2};
      if (take(s, "mlp.up_proj.")) return {lp + "mlp.dense_h_to_4h." + std::string(s), 1, 2};
      if (take(s, "mlp.down_proj.")) return {lp + "mlp.dense_4h_to_h." + std::string(s)};
    }
  }
  throw Error("tensor '" + canonical + "'", "has no ChatGLM2 name");
}

Checkpoint chatglm2_canonical_checkpoint(Checkpoint raw, const ModelConfig& cfg) {
  std::vector<Checkpoint::ViewTensor> view;
  const std::string root = raw.root().string();
  for (const auto& [name, ref] : raw.tensors()) {
    const ChatGlmName c = chatglm2_canonical_name(name, cfg);
    if (c.canonical.size() == 1) {
      view.push_back({c.canonical[0], name, 0, 0});
      continue;
    }
    if (c.canonical.empty()) continue;
    const TensorInfo& t = *ref.info;
    if (t.numel() == 1) {  // a per-tensor value: every part's
      for (const std::string& n : c.canonical)
        view.push_back({n, name, 0, 0});
      continue;
    }
    int64_t total = 0;
    for (int64_t p : c.part_rows)
      total += p;
    const auto rows = t.shape.empty() ? int64_t{0} : static_cast<int64_t>(t.shape[0]);
    bool ok = rows > 0 && total % rows == 0;
    const int64_t block = ok ? total / rows : 0;
    for (int64_t p : c.part_rows)
      ok = ok && p % block == 0;
    if (!ok)
      throw Error(root + ": tensor '" + name + "'",
                  "cannot be cut into its fused parts: " + std::to_string(rows) +
                      " rows for a fused output of " + std::to_string(total) +
                      " rows (per row, per block of rows dividing every part, or one value)");
    uint64_t begin = 0;
    for (size_t i = 0; i < c.canonical.size(); ++i) {
      const auto n = static_cast<uint64_t>(c.part_rows[i] / block);
      view.push_back({c.canonical[i], name, begin, begin + n});
      begin += n;
    }
  }
  return Checkpoint::renamed(std::move(raw), view);
}

Json chatglm2_canonical_description(const Json& desc, const ModelConfig& cfg,
                                    const std::string& where) {
  require_object(desc, where);
  Json out = Json::object();
  for (const auto& [k, v] : desc.items()) {
    if (!k.starts_with("transformer.")) {
      out[k] = v;
      continue;
    }
    for (const std::string& n : chatglm2_canonical_name(k, cfg).canonical) {
      if (out.contains(n))
        throw Error(key_where(where, k), "describes '" + n + "', which another key describes too");
      out[n] = v;
    }
  }
  return out;
}

Checkpoint open_model_checkpoint(const std::filesystem::path& path, const ModelConfig& cfg) {
  Checkpoint raw = Checkpoint::open(path);
  if (cfg.arch == Arch::kChatGlm2) return chatglm2_canonical_checkpoint(std::move(raw), cfg);
  if (cfg.arch == Arch::kGptOss) return gpt_oss_expert_view(std::move(raw), cfg);
  return language_model_view(std::move(raw), cfg);
}

}  // namespace qparity
