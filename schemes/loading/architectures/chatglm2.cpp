// ChatGLM2 (THUDM/chatglm2-6b modeling_chatglm.py, ChatGLMModel): Llama's pre-norm decoder with
//   - multi-query attention: multi_query_group_num KV groups, head h reading group
//     h / (heads / groups) (its key_layer.unsqueeze(-2).expand: the repeat_kv order);
//   - one fused query_key_value linear with bias, rows [q heads | k groups | v groups]: the
//     reference's fused qkv with q/k/v biases (the checkpoint view names its row blocks q_proj,
//     k_proj, v_proj: core/config/chatglm_names.h);
//   - RoPE on the first head_dim / 2 dims of each head in adjacent pairs, base 10000 * rope_ratio
//     (rope.h's interleaved variant), plain positions 0, 1, 2, ...;
//   - softmax scale 1 / sqrt(kv_channels) (query_key_layer_scaling's coefficient cancels: it
//     divides q and multiplies the fp32 scores back);
//   - dense_h_to_4h as a fused SwiGLU: silu(first ffn_hidden_size outputs) * the second half,
//     which is the reference's gate_up order; dense_4h_to_h; no MLP or o_proj bias;
//   - RMSNorm (input_layernorm, post_attention_layernorm, final_layernorm) and an untied
//     output_layer.
#include "core/error.h"
#include "schemes/loading/architectures/architectures.h"

namespace qparity::reference {

ArchBlocks chatglm2_blocks(const ModelConfig& cfg) {
  if (cfg.is_moe()) throw Error("config.json", "ChatGLM2 has no experts");
  if (!cfg.rope_interleaved || cfg.rotary_dim * 2 != cfg.head_dim)
    throw Error("config.json", "ChatGLM2 rotates head_dim / 2 dims in interleaved pairs");
  return {false, false};
}

}  // namespace qparity::reference
