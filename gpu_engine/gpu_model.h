#pragma once
// A Llama / Qwen3 / Qwen3-MoE model in device memory, laid out the way the engine's kernels
// read it: q/k/v fused into one [q + k + v, H] matrix, gate/up into [2I, H], experts stacked
// [E, 2I, H] (w13) and [E, H, I] (w2); a quantized linear as its GpuLinearMethod instead of a
// bf16 buffer. Shapes a kernel cannot take are zero-padded (shape_padding.h). How a checkpoint
// becomes one: model_loader.h.
#include <cuda_bf16.h>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_engine/quant/kv_cache_upload.h"
#include "schemes/description/dialect.h"

namespace qparity::gpu {

using Bf16Buffer = DeviceBuffer<__nv_bfloat16>;

struct GpuLayerWeights {
  bool moe = false;
  Bf16Buffer input_norm, post_norm;  // [H]
  Bf16Buffer q_norm, k_norm;         // [head_dim] (Qwen3), else empty
  Bf16Buffer qkv;                    // [q + 2 kv, H] ([q + 2 kv + q, H] with attn_gate)
  // [q + 2 kv] fp32 (ChatGLM2's add_qkv_bias) for an unquantized qkv, else empty: a quantized
  // method adds its bias in its own epilogue.
  DeviceBuffer<float> qkv_bias;
  Bf16Buffer o_proj;         // [H, q]
  Bf16Buffer gate_up, down;  // dense: [2I, H], [H, I]
  Bf16Buffer router;         // MoE: [E, H]
  Bf16Buffer w13, w2;        // MoE: [E, 2I', H], [E, H, I']
  // Norm biases (smooth-quant / anti-outlier folds; fp32, exact), empty when the norm has none.
  DeviceBuffer<float> input_norm_bias, post_norm_bias;
  // Quantized linears (their bf16 buffer above is then empty).
  std::unique_ptr<GpuLinearMethod> qkv_q, o_proj_q, gate_up_q, down_q;
  // Quantized MoE experts: one method per expert (their w13 / w2 buffers above then empty).
  std::vector<std::unique_ptr<GpuLinearMethod>> w13_q, w2_q;
  bool quantized_experts() const { return !w13_q.empty() || !w2_q.empty(); }
  // Whether the attention input or MLP input linears are quantized: the decode-sized fusions of
  // the RMSNorm into a bf16 GEMM's prologue then give way to a separate norm kernel.
  bool quantized_qkv() const { return qkv_q != nullptr || input_norm_bias.size() > 0; }
  bool quantized_gate_up() const { return gate_up_q != nullptr || post_norm_bias.size() > 0; }
  // The layer's KV-cache format and its parameters (bf16 unless the plan quantizes the cache).
  GpuKvCache kv;
  // Qwen3.5's Gated DeltaNet layer (linear_attention: no qkv / o_proj / KV cache, the cache
  // holds its recurrent state instead, kv_cache.h): lin_in [C + HV dv + 2 HV, H] is in_proj_qkv,
  // in_proj_z, in_proj_b, in_proj_a stacked (one GEMM, row [q | k | v | z | b | a]); lin_out
  // [H, HV dv] out_proj; conv [C, K], a_log, dt_bias [HV] and the gated norm's weight [dv] in
  // fp32 (exact copies of the checkpoint's values).
  bool linear_attention = false;
  Bf16Buffer lin_in, lin_out;
  DeviceBuffer<float> conv, a_log, dt_bias, lin_norm;
};

struct GpuModel {
  // The shapes this model computes: the checkpoint's config, or under tensor parallelism one
  // rank's (core/parallel/tp_sharding.h tp_rank_config: its heads, intermediate and vocabulary
  // rows), with `whole_cfg` the checkpoint's own.
  ModelConfig cfg;
  std::optional<ModelConfig> whole_cfg;
  int tp = 1, rank = 0;
  const ModelConfig& whole() const { return whole_cfg ? *whole_cfg : cfg; }
  std::filesystem::path dir;
  Bf16Buffer embed;       // [V, H]
  Bf16Buffer final_norm;  // [H]
  Bf16Buffer lm_head_own;
  const __nv_bfloat16* lm_head = nullptr;  // embed when tied, else lm_head_own
  std::vector<GpuLayerWeights> layers;
  DeviceBuffer<double> inv_freq;  // [head_dim / 2], fp64 from the reference's Rope
  // Image-text models: the M-RoPE row (0 time, 1 height, 2 width) each of inv_freq's
  // frequencies reads (reference_cpu/layers/mrope.h; 0 past the rotary ones); else empty.
  DeviceBuffer<int32_t> mrope_rows;
  double rope_scaling = 1.0;
  // Added to every RMSNorm weight but the Gated DeltaNet's, in fp32: 1 for zero-centred norms
  // (Qwen3.5's x̂ * (1 + w)), else 0.
  float norm_offset() const { return cfg.zero_centred_norms ? 1.f : 0.f; }
  // Qwen3.5's gated attention: the qkv row is [q | k | v | gate] (the gate's q_size rows after
  // v, each head's in logical order; bf16_model_loader.cpp splits q_proj's per-head [q | gate]
  // rows).
  bool attn_gate() const { return cfg.attn_output_gate; }
  // A quantized qkv method whose output is in the checkpoint's row order (Qwen3.5: q_proj's per
  // head [q | gate], q / k not re-laid out for RoPE): for each column of the kernels' qkv row,
  // the method's output column (rope_layout.h kernel_qkv_sources); empty when the methods'
  // rows are already the kernels'.
  DeviceBuffer<int32_t> qkv_sources;
  int64_t qkv_rows() const {
    const ModelConfig& k = kcfg();
    return k.q_size() + 2 * k.kv_size() + (attn_gate() ? k.q_size() : 0);
  }
  size_t weight_bytes = 0;  // device bytes of all weights
  // What the dumps record: the plan's quantized scheme ("bf16" when none; schemes joined by "+"
  // when the plan mixes several) and the dialect the GPU methods follow.
  std::string scheme = "bf16";
  Dialect dialect = Dialect::kVllm;
  // The shapes the kernels run when they differ from cfg's: head_dim and the intermediate sizes
  // zero-padded at load (shape_padding.h); empty when nothing is padded.
  std::optional<ModelConfig> padded;
  const ModelConfig& kcfg() const { return padded ? *padded : cfg; }
  std::vector<KvCacheFormat> kv_formats() const {
    std::vector<KvCacheFormat> f;
    for (const GpuLayerWeights& l : layers)
      f.push_back(l.kv.quant.format);
    return f;
  }
  bool quantized_kv_cache() const {
    for (const GpuLayerWeights& l : layers)
      if (l.kv.quant.format != KvCacheFormat::kBf16) return true;
    return false;
  }
};

// The RoPE tables of the model's config (fp64 inverse frequencies, the attention scaling); for a
// RoPE the kernels run re-laid out (rope_layout.h), its rotate-half frequencies.
void attach_rope(GpuModel& m);
// Each layer's q/k/v biases from the checkpoint (q_proj / k_proj / v_proj .bias, as the engine
// holds q / k: re-laid out for RoPE when rope_layout.h applies), as fp32, when the config has
// them and the layer's qkv is unquantized. The decoder adds them to the projection's fp32 sums
// before its one rounding to bf16 (kernels/bias_add.h).
void attach_qkv_bias(GpuModel& m, const Checkpoint& ck);
// Qwen3.5: each Gated DeltaNet layer's conv1d.weight ([C, 1, K] -> [C, K]), A_log, dt_bias and
// norm.weight as fp32 (exact: bf16, fp16 and fp32 values; NaN / Inf refused, naming the
// tensor).
void attach_linear_attention(GpuModel& m, const Checkpoint& ck);

}  // namespace qparity::gpu
