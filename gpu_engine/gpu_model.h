#pragma once
// An unquantized (bf16) Llama / Qwen3 / Qwen3-MoE model in device memory, laid out the way the
// engine's kernels read it: q/k/v fused into one [q + k + v, H] matrix, gate/up into
// [2I, H], experts stacked [E, 2I, H] (w13) and [E, H, I] (w2). Loading goes structure first
// (config, every tensor's presence, dtype and shape checked, all device buffers allocated), then
// weights (streamed through StagedUploader). Quantized checkpoints are refused by name: the
// engine's quantized linear methods are not built yet.
#include <cuda_bf16.h>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <vector>

#include "core/config/model_config.h"
#include "gpu_engine/device_buffer.h"

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
};

// Throws qparity::Error naming the file / tensor and the violated constraint.
std::unique_ptr<GpuModel> load_gpu_model(const std::filesystem::path& dir, std::ostream* progress);

// A model of `cfg`'s shapes with pseudo-random weights (N(0, 0.02), norms N(1, 0.02)) made on the
// device: for benches of real model sizes without a checkpoint on disk.
std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& cfg, uint64_t seed);

}  // namespace qparity::gpu
