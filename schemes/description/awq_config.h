#pragma once
// config.json `quantization_config` with quant_method "awq" (AutoAWQ; transformers AwqConfig)
// -> QuantPlan: every quantized linear is the kPackedInt point {4 bits, group_size, asymmetric}
// stored in AutoAWQ's GEMM layout (schemes/int/awq_layout.h; PlanEntry::format "awq"). Rules, as
// vLLM's AWQConfig / AWQMarlinConfig read them (docs/GPTQ-AWQ.md has the sources):
//   * bits (alias w_bit) 4; group_size (alias q_group_size) > 0 dividing K, or -1 (one group);
//   * zero_point true (the GEMM packing stores zero points; false is refused by name);
//   * version "gemm" (default); "gemv" / "gemv_fast" / "exllama" / "ipex" / "marlin" are other
//     layouts, refused by name; backend "llm-awq" likewise;
//   * modules_to_not_convert: a linear stays unquantized when an entry is a substring of its
//     name (vLLM's is_layer_skipped_awq); lm_head and MoE routers are never quantized.
// Keys that only describe calibration or fusing at run time are accepted; unknown keys become
// plan warnings naming them.
#include <string>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

QuantPlan plan_from_awq_config(const ModelConfig& cfg, const Json& qc, const std::string& where);

}  // namespace qparity
