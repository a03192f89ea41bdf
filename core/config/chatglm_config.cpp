#include "core/config/chatglm_config.h"

#include <cmath>

#include "core/error.h"

namespace qparity {

namespace {

constexpr int64_t kMaxSize = int64_t{1} << 24;

int64_t positive(const Json& j, std::string_view key, const std::string& where,
                 std::optional<int64_t> fallback = std::nullopt, int64_t max = kMaxSize) {
  const auto v = opt_int(j, key, where);
  if (!v && !fallback) throw Error(where, "missing required key '" + std::string(key) + "'");
  const int64_t x = v ? *v : *fallback;
  if (x <= 0 || x > max)
    throw Error(key_where(where, key),
                "must be in [1, " + std::to_string(max) + "], got " + std::to_string(x));
  return x;
}

// A boolean the reference only implements one way: absent means the config class's default.
void require_flag(const Json& j, std::string_view key, const std::string& where, bool dflt,
                  bool implemented, const std::string& why) {
  const bool v = opt_bool(j, key, where).value_or(dflt);
  if (v != implemented)
    throw Error(key_where(where, key), std::string(v ? "true" : "false") +
                                           " is not implemented by the qparity reference (" + why +
                                           ")");
}

}  // namespace

ModelConfig parse_chatglm2_config(const Json& j, const std::string& where,
                                  const std::string& arch) {
  ModelConfig c;
  c.arch = Arch::kChatGlm2;
  c.arch_name = arch;
  if (auto mt = opt_string(j, "model_type", where)) {
    if (*mt != "chatglm")
      throw Error(key_where(where, "model_type"),
                  "'" + *mt + "' does not match architecture " + arch + " (expected 'chatglm')");
    c.model_type = *mt;
  }
  // Defaults are ChatGLMConfig.__init__'s (configuration_chatglm.py).
  c.num_layers = positive(j, "num_layers", where, 28, 4096);
  c.hidden = positive(j, "hidden_size", where, 4096);
  c.num_heads = positive(j, "num_attention_heads", where, 32);
  if (c.hidden % c.num_heads != 0 && !opt_int(j, "kv_channels", where))
    throw Error(where, "hidden_size (" + std::to_string(c.hidden) +
                           ") is not divisible by num_attention_heads (" +
                           std::to_string(c.num_heads) + ") and kv_channels is not given");
  c.head_dim = positive(j, "kv_channels", where, c.hidden / c.num_heads);
  const bool mqa = opt_bool(j, "multi_query_attention", where).value_or(false);
  c.num_kv_heads = mqa ? positive(j, "multi_query_group_num", where, 1) : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    throw Error(where, "num_attention_heads (" + std::to_string(c.num_heads) +
                           ") is not divisible by multi_query_group_num (" +
                           std::to_string(c.num_kv_heads) + ")");
  c.intermediate = positive(j, "ffn_hidden_size", where, 13696);
  c.vocab = positive(j, "padded_vocab_size", where, 65024);
  c.max_position_embeddings = positive(j, "seq_length", where, 2048, int64_t{1} << 40);
  const double eps = opt_number(j, "layernorm_epsilon", where).value_or(1e-5);
  if (!(eps > 0.0) || !std::isfinite(eps))
    throw Error(key_where(where, "layernorm_epsilon"), "must be positive and finite");
  c.rms_norm_eps = eps;
  c.qkv_bias = opt_bool(j, "add_qkv_bias", where).value_or(false);
  c.dtype = parse_config_dtype(j, where);

  // RotaryEmbedding(rotary_dim // 2) with rotary_dim = kv_channels: the first half of each
  // head rotates, in adjacent pairs; base 10000 * rope_ratio (ChatGLM3-32k's rope_ratio).
  if (c.head_dim % 4 != 0)
    throw Error(where,
                "kv_channels (" + std::to_string(c.head_dim) +
                    ") must be a multiple of 4: ChatGLM2 rotates head_dim / 2 dims in pairs");
  c.rotary_dim = c.head_dim / 2;
  c.rope_interleaved = true;
  const double ratio = opt_number(j, "rope_ratio", where).value_or(1.0);
  if (!(ratio > 0.0) || !std::isfinite(ratio))
    throw Error(key_where(where, "rope_ratio"), "must be positive and finite");
  c.rope_theta = 10000.0 * ratio;
  // The published config writes tie_word_embeddings false; output_layer is its own Linear.
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", where).value_or(false);

  require_flag(j, "rmsnorm", where, true, true, "LayerNorm blocks: only rmsnorm true");
  require_flag(j, "apply_residual_connection_post_layernorm", where, false, false,
               "the residual is the layer's input");
  require_flag(j, "post_layer_norm", where, true, true, "the final RMSNorm is required");
  require_flag(j, "add_bias_linear", where, false, false,
               "bias on dense / dense_h_to_4h / dense_4h_to_h");
  require_flag(j, "fp32_residual_connection", where, false, false,
               "the residual stream is kept in the model dtype");
  require_flag(j, "interleaved_qkv", where, false, false,
               "query_key_value rows are [q heads | k groups | v groups]");
  if (auto qb = opt_int(j, "quantization_bit", where); qb && *qb != 0)
    throw Error(key_where(where, "quantization_bit"),
                std::to_string(*qb) +
                    ": ChatGLM's own in-model weight quantization is not implemented by the "
                    "qparity reference (quantize with msModelSlim's formats instead)");
  if (auto it = j.find("pre_seq_len"); it != j.end() && !it->is_null())
    throw Error(key_where(where, "pre_seq_len"),
                "P-tuning v2 prefix encoders are not implemented by the qparity reference");
  return c;
}

}  // namespace qparity
