#pragma once
// config.json `quantization_config` with quant_method "gptq" (AutoGPTQ, GPTQModel, Optimum /
// transformers GPTQConfig) -> QuantPlan: every quantized linear is the kPackedInt point
// {bits, group_size (-1: channel), sym, desc_act -> act order} stored in the GPTQ layout
// (schemes/int/gptq_layout.h; PlanEntry::format "gptq" or "gptq_v2"). Rules, as vLLM's
// GPTQConfig / GPTQMarlinConfig and GPTQModel read them (docs/GPTQ-AWQ.md has the sources):
//   * bits 2, 3, 4, 8; group_size -1 or > 0 dividing K; desc_act with group_size -1 is column
//     order (vLLM ignores g_idx then);
//   * checkpoint_format (GPTQModel also writes it as `format`) "gptq" (v1: stored zero - 1) or
//     "gptq_v2"; "marlin" / "bitblas" / other repacked layouts are refused by name;
//   * pack_dtype other than int32 refused by name (vLLM reads int32 words only);
//   * modules_in_block_to_quantize (Optimum): a linear is quantized when an entry is a substring
//     of its name (vLLM's is_layer_gptq_quantized); absent or empty: every decoder linear;
//   * dynamic (GPTQModel): "-:<regex>" leaves the linears it matches unquantized, "+:<regex>" or
//     "<regex>" overrides bits / group_size / desc_act / sym for them; regexes match module names
//     with Python re.match (anchored at the start), the first matching entry in file order wins
//     (vLLM's get_dynamic_override);
//   * lm_head true: lm_head quantized too (GPTQModel); MoE routers never.
// Keys that only describe calibration (damp_percent, true_sequential, static_groups, meta, ...)
// are listed as read-but-not-used; keys unknown here become plan warnings naming them.
#include <string>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

QuantPlan plan_from_gptq_config(const ModelConfig& cfg, const Json& qc, const std::string& where);

}  // namespace qparity
