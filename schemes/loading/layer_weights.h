#pragma once
// What a decoder layer's weights are, once loaded and processed: the blocks both engines compose
// (the fp64 reference runs them in reference_cpu/models/causal_lm.h; the GPU engine uploads them
// one layer at a time in gpu_engine/planned_model_loader.cpp). Weights only: a sequence's state
// (KV rows, the Gated DeltaNet's recurrent state) belongs to the engine that runs it.
// Every linear is a LinearMethod (schemes/method/linear_method.h) holding the checkpoint's
// tensors in their own dtypes; norms and the Gated DeltaNet's small parameters are fp64 values,
// decoded exactly from the checkpoint's float dtype.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "schemes/kv/kv_cache_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::reference {

struct NormWeights {
  std::vector<double> weight;
  std::vector<double> bias;  // msModelSlim anti-outlier norms; empty otherwise
};

// Qwen3.5's Gated DeltaNet parameters besides its linears (reference_cpu/layers/gated_delta_net.h
// states the math).
struct GatedDeltaNetParams {
  LinearAttentionDims dims;
  std::vector<double> conv;     // [C, K] (the checkpoint's [C, 1, K]); tap K-1 is the newest
  std::vector<double> a_log;    // [HV]
  std::vector<double> dt_bias;  // [HV]
  std::vector<double> norm;     // [dv], the gated norm's plain weight
  double eps = 1e-6;            // the gated norm's (rms_norm_eps)
};

struct AttentionBlock {
  std::string prefix;  // "model.layers.0.self_attn"
  std::unique_ptr<LinearMethod> qkv;
  std::unique_ptr<LinearMethod> o_proj;
  std::optional<NormWeights> q_norm, k_norm;
  std::unique_ptr<KvCacheMethod> kv;
  std::vector<double> sinks;  // gpt-oss: one logit per attention head (`sinks` [H]); else empty
};

struct MlpBlock {
  std::string prefix;  // "model.layers.0.mlp"
  std::unique_ptr<LinearMethod> gate_up;
  std::unique_ptr<LinearMethod> down;
};

struct MoeBlock {
  std::string prefix;                    // "model.layers.0.mlp"
  std::unique_ptr<LinearMethod> router;  // mlp.gate, [E, H]
  std::unique_ptr<LinearMethod> w13;     // experts' gate/up, E x [2I, H]
  std::unique_ptr<LinearMethod> w2;      // experts' down, E x [H, I]
};

// Qwen3.5's Gated DeltaNet token mixer.
struct LinearAttentionBlock {
  std::string prefix;                      // "model.layers.0.linear_attn"
  std::unique_ptr<LinearMethod> qkvz;      // in_proj_qkv | in_proj_z fused (vLLM's in_proj_qkvz)
  std::unique_ptr<LinearMethod> ba;        // in_proj_b | in_proj_a fused (vLLM's in_proj_ba)
  std::unique_ptr<LinearMethod> out_proj;  // [hidden, HV dv]
  GatedDeltaNetParams params;              // conv1d, A_log, dt_bias, the gated norm's weight
};

struct LayerWeights {
  int64_t index = 0;
  NormWeights input_norm, post_attention_norm;
  AttentionBlock attn;                              // full-attention layers
  std::optional<LinearAttentionBlock> linear_attn;  // Gated DeltaNet layers (attn unused)
  std::optional<MlpBlock> mlp;
  std::optional<MoeBlock> moe;
};

// Every linear method the layer holds (the ones it has, in execution order).
std::vector<const LinearMethod*> linear_methods(const LayerWeights& l);

// What lies outside the decoder layers. The embedding table is read in place from the memory map
// (the checkpoint must outlive it); a tied lm_head reads the same tensor.
struct TopWeights {
  TensorView embed;
  NormWeights final_norm;
  std::unique_ptr<LinearMethod> lm_head;
};

// "bfloat16" / "float16" / "float32" (config.json `torch_dtype` / `dtype`) -> DType; empty means
// bf16. Other values throw naming the config key.
DType model_dtype_of(const ModelConfig& cfg);

}  // namespace qparity::reference
