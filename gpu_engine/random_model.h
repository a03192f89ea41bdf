#pragma once
// Models of real sizes without a checkpoint on disk, for benches.
#include <cstdint>
#include <memory>
#include <string>

#include "core/config/model_config.h"
#include "gpu_engine/gpu_model.h"

namespace qparity::gpu {

// A model of `cfg`'s shapes with pseudo-random weights (N(0, 0.02), norms N(1, 0.02)) made on the
// device. `expert_scheme`: the MoE experts' format, "bf16", or quantized as "fp8-block" (vLLM's
// 128 x 128 blocks and 1 x 128 dynamic activation groups) or "w4a16-g32" (int4 symmetric, bf16
// group-32 scales) with random codes (Fp8LinearMethod::random_block,
// WeightOnlyIntMethod::Random); attention and the head stay bf16.
// `dense_scheme`: the attention and dense MLP linears, "bf16", "fp8-block" (random codes as the
// experts'), or weight-only "w4a16-g32", "ct-w4a16-g128", "w8a16-ch" (random codes in the
// tensor-core layout, one bf16 scale value). Under tensor parallelism cfg is one rank's shapes
// (tp_rank_config); the caller sets whole_cfg, tp and rank.
std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& cfg, uint64_t seed,
                                           const std::string& expert_scheme = "bf16",
                                           const std::string& dense_scheme = "bf16");

}  // namespace qparity::gpu
