#pragma once
// Shapes the kernels cannot take as they are, made exact by zero padding at load:
//   head_dim not a multiple of 32 (the attention kernels hold a head in whole warp lanes): each
//     head is laid out in hp = round_up(head_dim, 32) columns, its first half at [0, head_dim/2)
//     and its second half at [hp/2, hp/2 + head_dim/2). RoPE's rotate-half partners (i, i + hp/2)
//     are then the model's (i, i + head_dim/2), and the padded inv_freq holds the model's
//     frequencies in its first head_dim/2 entries (zeros rotate to zeros after them). The q/k/v
//     weight rows of the padding are zero, so q, k and v are zero there; QK^T gains zero terms;
//     V's zero columns give zero attention outputs, which meet zero o_proj columns. The softmax
//     scale 1/sqrt(head_dim) and the q/k norm's divisor stay the model's (the kernels take both).
//   intermediate_size / moe_intermediate_size not a multiple of 8 (GEMM rows are read 16 bytes
//     at a time): gate and up each get zero rows up to a multiple of 8, SiLU(0) * 0 = 0, and
//     down gets zero columns.
// Exact: a padded value is a zero that only ever enters sums (an fp32 sum started at +0 keeps
// every value, and its sign, when +0 or -0 terms join it), so every logical output is the
// unpadded computation's. Captures pick the logical columns (capture.h), so dumps and goldens
// never see the padding.
// Not padded (refused with the reason): hidden_size (every RMSNorm divides by it), an odd
// head_dim or one above 256, and a quantized linear whose shape would need padding.
#include <cstdint>
#include <vector>

#include "core/config/model_config.h"
#include "gpu_engine/capture.h"
#include "gpu_engine/gpu_model.h"

namespace qparity::gpu {

// cfg with head_dim and the intermediate sizes rounded up as above; throws naming the config key
// for a shape the engine cannot run at all. `where` names the config file in errors.
ModelConfig kernel_shapes(const ModelConfig& cfg, const std::string& where);

// Where the logical columns of the padded layouts sit (capture column maps; each empty when that
// dimension is not padded).
struct PaddedColumns {
  ColumnMap qkv;      // a [q heads | k heads | v heads] row
  ColumnMap q, k;     // q heads alone, k (or v) heads alone
  ColumnMap gate_up;  // [gate | up]
  ColumnMap act;      // SiLU-and-mul output
};
PaddedColumns padded_columns(const ModelConfig& logical, const ModelConfig& kernel);

// Throws naming model.layers.<layer>.<linear> when `quantized` and the linear's shape needs
// padding under kernel_shapes(cfg): linear is "self_attn.qkv_proj", "self_attn.o_proj" (head_dim)
// or "mlp.gate_up_proj", "mlp.down_proj" (intermediate_size). Loaders call it before any weight
// is read.
void require_unpadded(const ModelConfig& cfg, int64_t layer, const std::string& linear,
                      bool quantized);

// Re-lays the weights of a model loaded in cfg's shapes into kernel_shapes(cfg) and sets
// m.padded (nothing when no dimension needs padding). Throws naming the layer for a quantized
// linear that would need padding.
void pad_for_kernels(GpuModel& m);

}  // namespace qparity::gpu
