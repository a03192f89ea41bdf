#pragma once
// How load_gpu_model (model_loader.h) reads a checkpoint.
#include <optional>
#include <string>

#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/description/dialect.h"

namespace qparity::gpu {

struct GpuLoadOptions {
  std::optional<std::string> override_scheme;  // --scheme
  // The engine the GPU methods imitate, bit for bit where a scheme quantizes activations (vllm or
  // sglang; weight-only schemes compute the same in every dialect).
  Dialect dialect = Dialect::kVllm;
  GpuMethodOptions methods;  // test-only fault injection
  // Tests only: an unquantized checkpoint through the planned loader (planned_model_loader.h), so
  // that its placement of unquantized weights is checked bit for bit against the bf16 loader's.
  bool planned_even_if_unquantized = false;
  // Tensor parallelism: load rank `rank`'s shard of tp (schemes/parallel/checkpoint_shard.h) as a
  // model of that rank's shapes (GpuModel::cfg; whole_cfg the checkpoint's).
  int tp = 1, rank = 0;
};

}  // namespace qparity::gpu
