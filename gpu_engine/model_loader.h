#pragma once
// Checkpoint directory -> GpuModel. Which scheme each linear runs is the QuantPlan's, built as the
// reference builds it (--scheme > quant_model_description.json > config.json
// quantization_config). A checkpoint whose plan quantizes nothing streams its tensors to the
// device as bf16 (bf16_model_loader.h); any other goes through the lifecycle the reference shares
// (planned_model_loader.h): quantized linears become GpuLinearMethods, the rest bf16 buffers. A
// plan entry the GPU cannot run (a scheme without a GPU method, a quantized KV cache or expert
// stack) is refused by name before any weight is read; every checkpoint tensor must be consumed
// (an unexpected one is an Error naming it). No quantized layer ever runs as bf16. Either way the
// model is then zero-padded where a kernel needs it (shape_padding.h).
#include <filesystem>
#include <iosfwd>
#include <memory>

#include "gpu_engine/gpu_model.h"
#include "gpu_engine/load_options.h"

namespace qparity::gpu {

// Throws qparity::Error naming the file / tensor and the violated constraint.
std::unique_ptr<GpuModel> load_gpu_model(const std::filesystem::path& dir, std::ostream* progress,
                                         const GpuLoadOptions& options = {});

}  // namespace qparity::gpu
