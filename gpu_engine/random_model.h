#pragma once
// Models of real sizes without a checkpoint on disk, for benches.
#include <cstdint>
#include <memory>

#include "core/config/model_config.h"
#include "gpu_engine/gpu_model.h"

namespace qparity::gpu {

// A model of `cfg`'s shapes with pseudo-random weights (N(0, 0.02), norms N(1, 0.02)) made on the
// device.
std::unique_ptr<GpuModel> random_gpu_model(const ModelConfig& cfg, uint64_t seed);

}  // namespace qparity::gpu
