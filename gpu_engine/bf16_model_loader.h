#pragma once
// An unquantized checkpoint -> GpuModel, structure first (config, every tensor's presence, dtype
// and shape checked, every device buffer allocated, a tensor nothing consumes an Error naming it),
// then weights streamed through StagedUploader (F16 / F32 rounded to bf16 once), then the
// kernels' zero padding (shape_padding.h).
#include <filesystem>
#include <iosfwd>
#include <memory>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"
#include "gpu_engine/gpu_model.h"

namespace qparity::gpu {

// `ck`: the checkpoint of `dir` or one rank's shard of it; cfg: its shapes.
std::unique_ptr<GpuModel> load_bf16_gpu_model(const Checkpoint& ck,
                                              const std::filesystem::path& dir, ModelConfig cfg,
                                              std::ostream* progress);

}  // namespace qparity::gpu
