#pragma once
// msModelSlim `quant_model_description.json` (v1) / `quant_model_description_<type>.json` (v0)
// -> QuantPlan (spec/FORMATS.md §5.1, §5.3–5.8).
//
// The file is a flat dict: every tensor name -> its type string, plus global keys
// (model_quant_type, version, group_size, kv_cache_type, kv_quant_type, fa_quant_type,
// reduce_quant_type, metadata, optional, model_quant_type_second). Dispatch is per linear, by the
// type of `<prefix>.weight`, never by model_quant_type (mixed files are normal: lm_head FLOAT):
//   FLOAT -> bf16; W8A16 -> w8a16-ch (group_size 0) or w8a16-g<group_size>; W8A8 -> w8a8-static;
//   W8A8S -> w8a8s; W8A8_DYNAMIC -> w8a8-int8-dyn; WFP8AFP8_DYNAMIC -> fp8-channel;
//   C8 `<attn>.{k,v}_proj.kv_cache_{scale,offset}` -> kv-int8;
//   `<norm>.bias` or `<norm>.module.weight` -> smoothquant on that norm.
// W8A8SC and the other known types are rejected by name. Every module of the model must have its
// `.weight` entry and every entry must name a tensor of a module of the model.
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

// Types qparity maps to a scheme (FLOAT included).
const std::vector<std::string>& msmodelslim_supported_types();
// Every type string msModelSlim is known to write (supported or not).
const std::vector<std::string>& msmodelslim_known_types();

// `where` names the file in messages and provenance.
QuantPlan plan_from_msmodelslim(const ModelConfig& cfg, const Json& description,
                                const std::string& where);

}  // namespace qparity
