#pragma once
// An unquantized (bf16) Llama / Qwen3 / Qwen3-MoE model in device memory, laid out the way the
// engine's kernels read it: q/k/v fused into one [q + k + v, H] matrix, gate/up into
// [2I, H], experts stacked [E, 2I, H] (w13) and [E, H, I] (w2). Loading goes structure first
// (config, every tensor's presence, dtype and shape checked, all device buffers allocated), then
// weights (streamed through StagedUploader).
//
// Which scheme each linear runs is the QuantPlan's, built as the reference builds it (--scheme >
// quant_model_description.json > config.json quantization_config). A checkpoint whose plan
// quantizes nothing loads by the fast bf16 path above; any other goes through the lifecycle the
// reference shares (quant/gpu_linear_method.h, planned_model_loader.cpp): quantized linears get a
// GpuLinearMethod, the rest bf16 buffers. A plan entry the GPU cannot run (a scheme without a GPU
// method, a quantized KV cache or expert stack, a folded norm bias) is refused by name before
// any weight is read; every checkpoint tensor must be consumed (an unexpected one is an Error
// naming it). No quantized layer ever runs as bf16.
#include <cuda_bf16.h>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "reference_cpu/quant/dialect.h"

namespace qparity::gpu {

using Bf16Buffer = DeviceBuffer<__nv_bfloat16>;

struct GpuLayerWeights {
  bool moe = false;
  Bf16Buffer input_norm, post_norm;  // [H]
  Bf16Buffer q_norm, k_norm;         // [head_dim] (Qwen3), else empty
  Bf16Buffer qkv;                    // [q + 2 kv, H]
  Bf16Buffer o_proj;                 // [H, q]
  Bf16Buffer gate_up, down;          // dense: [2I, H], [H, I]
  Bf16Buffer router;                 // MoE: [E, H]
  Bf16Buffer w13, w2;                // MoE: [E, 2I', H], [E, H, I']
  // Norm biases (smooth-quant / anti-outlier folds; fp32, exact), empty when the norm has none.
  DeviceBuffer<float> input_norm_bias, post_norm_bias;
  // Quantized linears (their bf16 buffer above is then empty).
  std::unique_ptr<GpuLinearMethod> qkv_q, o_proj_q, gate_up_q, down_q;
  // Whether the attention input or MLP input linears are quantized: the decode-sized fusions of
  // the RMSNorm into a bf16 GEMM's prologue then give way to a separate norm kernel.
  bool quantized_qkv() const { return qkv_q != nullptr || input_norm_bias.size() > 0; }
  bool quantized_gate_up() const { return gate_up_q != nullptr || post_norm_bias.size() > 0; }
};

struct GpuModel {
  ModelConfig cfg;
  std::filesystem::path dir;
  Bf16Buffer embed;       // [V, H]
  Bf16Buffer final_norm;  // [H]
  Bf16Buffer lm_head_own;
  const __nv_bfloat16* lm_head = nullptr;  // embed when tied, else lm_head_own
  std::vector<GpuLayerWeights> layers;
  DeviceBuffer<double> inv_freq;  // [head_dim / 2], fp64 from the reference's Rope
  double rope_scaling = 1.0;
  size_t weight_bytes = 0;  // device bytes of all weights
  // What the dumps record: the plan's quantized scheme ("bf16" when none; schemes joined by "+"
  // when the plan mixes several) and the dialect the GPU methods follow.
  std::string scheme = "bf16";
  reference::Dialect dialect = reference::Dialect::kVllm;
  // The shapes the kernels run when they differ from cfg's: head_dim and the intermediate sizes
  // zero-padded at load (shape_padding.h); empty when nothing is padded.
  std::optional<ModelConfig> padded;
  const ModelConfig& kcfg() const { return padded ? *padded : cfg; }
};

struct GpuLoadOptions {
  std::optional<std::string> override_scheme;  // --scheme
  // The engine the GPU methods imitate, bit for bit where a scheme quantizes activations (vllm or
  // sglang; weight-only schemes compute the same in every dialect).
  reference::Dialect dialect = reference::Dialect::kVllm;
  GpuMethodOptions methods;  // test-only fault injection
};

// Throws qparity::Error naming the file / tensor and the violated constraint.
std::unique_ptr<GpuModel> load_gpu_model(const std::filesystem::path& dir, std::ostream* progress,
                                         const GpuLoadOptions& options = {});

// A model of `cfg`'s shapes with pseudo-random weights (N(0, 0.02), norms N(1, 0.02)) made on the
// device: for benches of real model sizes without a checkpoint on disk.
std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& cfg, uint64_t seed);

}  // namespace qparity::gpu
