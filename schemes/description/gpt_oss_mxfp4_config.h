#pragma once
// config.json `quantization_config` with quant_method "mxfp4" (OpenAI's gpt-oss release;
// transformers Mxfp4Config / Mxfp4HfQuantizer, vLLM Mxfp4Config) -> QuantPlan. Rules, as the
// engines read it (docs/GPT-OSS.md has the sources):
//   * every MoE expert stack is the point mxfp4a16: e2m1 weights with an E8M0 scale per 32
//     input features, weight-only (vLLM: supported act dtype bf16, the experts' inputs stay
//     bf16), stored as gpt-oss's *_blocks / *_scales (core/safetensors/gpt_oss_names.h);
//   * every other linear is unquantized: vLLM's Mxfp4Config gives LinearBase the unquantized
//     method whatever the config says, and transformers converts only GptOssExperts;
//   * modules_to_not_convert: transformers' should_convert_module (a pattern matches a module
//     when it regex-matches at the start of its name or the name ends with it). vLLM ignores the
//     list (Mxfp4Config.from_config returns cls()), so an expert stack it names would be read as
//     MXFP4 by one engine and bf16 by the other: refused by name. Entries naming other modules
//     ("model.layers.*.self_attn", "lm_head", ...) agree with both.
// Unknown keys become plan warnings naming them; `dequantize` (transformers' load option) is
// accepted and changes nothing in the checkpoint.
#include <string>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

QuantPlan plan_from_mxfp4_config(const ModelConfig& cfg, const Json& qc, const std::string& where);

}  // namespace qparity
