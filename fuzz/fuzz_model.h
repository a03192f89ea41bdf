#pragma once
// A small Qwen3-MoE model (dense and sparse layers, experts, QK-norm) that the quantization
// config fuzzers plan against, so MoE, KV-cache and norm rules are all reachable.
#include "core/config/model_config.h"
#include "core/json_util.h"

inline const qparity::ModelConfig& fuzz_model() {
  static const qparity::ModelConfig cfg = qparity::parse_model_config(qparity::Json::parse(R"({
        "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 256,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"})"),
                                                                      "fuzz config.json");
  return cfg;
}
