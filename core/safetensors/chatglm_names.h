#pragma once
// ChatGLM2's checkpoint names (THUDM/chatglm2-6b, and msModelSlim's quantized ChatGLM2 as its
// weight-format document shows them) seen as the canonical Hugging Face Llama names every other
// part of qparity reads, and back for writers. Nothing is copied: a fused tensor's parts are row
// blocks of it (Checkpoint::renamed).
//
//   transformer.embedding.word_embeddings.weight          model.embed_tokens.weight
//   transformer.encoder.layers.L.input_layernorm.*        model.layers.L.input_layernorm.*
//   transformer.encoder.layers.L.post_attention_layernorm.*  ...post_attention_layernorm.*
//     (* includes msModelSlim's anti-outlier module.weight / module.bias)
//   ...L.self_attention.query_key_value.<t>               ...L.self_attn.{q,k,v}_proj.<t>: rows
//                                                          [q heads | k groups | v groups]
//   ...L.self_attention.query_key_value.{k,v}_proj.kv_cache_{scale,offset}   (msModelSlim C8 on
//                                                          the fused qkv) ...self_attn.{k,v}_proj.
//                                                          kv_cache_{scale,offset}
//   ...L.self_attention.dense.<t>                         ...L.self_attn.o_proj.<t>
//   ...L.mlp.dense_h_to_4h.<t>                            ...L.mlp.{gate,up}_proj.<t>: rows
//                                                          [gate (silu'd) | up]
//   ...L.mlp.dense_4h_to_h.<t>                            ...L.mlp.down_proj.<t>
//   transformer.encoder.final_layernorm.*                 model.norm.*
//   transformer.output_layer.<t>                          lm_head.<t>
//   transformer.rotary_pos_emb.inv_freq                   (dropped: the reference computes the
//                                                          frequencies in fp64, rope.h)
// A fused tensor <t> splits by its first dimension: rows = the fused output rows (weights, bias,
// per-channel scales, quant_bias, deq_scale, packed weights packed along K), or one row per
// block of b rows when every part is a multiple of b (block scales); a tensor of one element
// (per-tensor input_scale / input_offset) is shared by every part. Anything else is an Error.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "core/safetensors/checkpoint.h"

namespace qparity {

// What one ChatGLM2 tensor name is in canonical names.
struct ChatGlmName {
  std::vector<std::string> canonical;  // 1 (a rename), 2 or 3 (a fused tensor's parts), 0 (dropped)
  std::vector<int64_t> part_rows;      // the parts' output rows when fused (q, k, v or gate, up)
};
// Throws an Error naming the tensor when it is none of the names above (or its layer is out of
// range).
ChatGlmName chatglm2_canonical_name(const std::string& name, const ModelConfig& cfg);

// The ChatGLM2 name a canonical tensor is written under, and its place in a fused tensor.
struct ChatGlmTarget {
  std::string name;
  int64_t part = 0, parts = 1;
};
ChatGlmTarget chatglm2_target_name(const std::string& canonical, const ModelConfig& cfg);

// The view of a ChatGLM2 checkpoint under canonical names (every tensor accounted for).
Checkpoint chatglm2_canonical_checkpoint(Checkpoint raw, const ModelConfig& cfg);

// msModelSlim quant_model_description.json with its tensor keys in canonical names (a fused
// tensor's type given to every part); other keys unchanged. `where` names the file.
Json chatglm2_canonical_description(const Json& desc, const ModelConfig& cfg,
                                    const std::string& where);

// A model's checkpoint as qparity reads it: Checkpoint::open, seen under canonical names when the
// architecture names its tensors otherwise (ChatGLM2; an image-text checkpoint's language model,
// language_model_names.h).
Checkpoint open_model_checkpoint(const std::filesystem::path& path, const ModelConfig& cfg);

}  // namespace qparity
