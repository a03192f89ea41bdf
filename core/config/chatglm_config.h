#pragma once
// ChatGLM2's config.json (THUDM/chatglm2-6b configuration_chatglm.py, a remote-code config with
// its own key names) read into the ModelConfig fields the shared blocks use:
//   num_layers -> num_layers, hidden_size, num_attention_heads, kv_channels -> head_dim,
//   multi_query_group_num -> num_kv_heads (when multi_query_attention, else num_heads),
//   ffn_hidden_size -> intermediate, padded_vocab_size -> vocab, seq_length ->
//   max_position_embeddings, layernorm_epsilon -> rms_norm_eps, add_qkv_bias -> qkv_bias,
//   rope: base 10000 * rope_ratio, rotary_dim = head_dim / 2, interleaved pairs.
// What the modelling code can do but the qparity reference does not (LayerNorm instead of
// RMSNorm, post-layernorm residuals, no final norm, biases on every linear, fp32 residuals,
// ChatGLM's own int4/int8 weight quantization) is refused by key.
#include <string>

#include "core/config/model_config.h"
#include "core/json_util.h"

namespace qparity {

// `arch` is architectures[0] as written; `where` names the file in errors.
ModelConfig parse_chatglm2_config(const Json& j, const std::string& where, const std::string& arch);

}  // namespace qparity
