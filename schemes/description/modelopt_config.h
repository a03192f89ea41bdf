#pragma once
// NVIDIA ModelOpt checkpoints -> QuantPlan: hf_quant_config.json ({"producer": {"name":
// "modelopt", "version"}, "quantization": {"quant_algo", "kv_cache_quant_algo",
// "exclude_modules", "group_size"}}) beside config.json, or config.json's quantization_config
// with quant_method "modelopt" (quant_algo, ignore, kv_cache_scheme, config_groups). Rules, as
// vLLM's ModelOptQuantConfigBase reads them (docs/MODELOPT.md has the sources):
//   * quant_algo FP8: fp8-tensor (e4m3 weights with one F32 weight_scale, static per-tensor
//     input_scale; scales 0-dim or [1]) in the layout "modelopt" - the compressed-tensors tensor
//     names, per-shard scales that vLLM requantizes to their maximum when fused;
//   * quant_algo FP8_PER_CHANNEL_PER_TOKEN: fp8-channel (F32 weight_scale [N], inputs dynamic
//     per token, no input_scale);
//   * kv_cache_quant_algo FP8 (config.json form: kv_cache_scheme {"type": "float", "num_bits":
//     8}): kv-fp8 with ModelOpt's <attn>.k_proj.k_scale / v_proj.v_scale (vLLM remaps them to
//     attn.k_scale / v_scale);
//   * FP8_PB_WO: fp8-block-a16 (F32 weight_scale [N/128, 1, K/128, 1]; the vllm dialect quantizes
//     the inputs 1x128 as vLLM does); MXFP8: mxfp8; NVFP4 / W4A16_NVFP4: nvfp4 / nvfp4a16;
//   * MIXED_PRECISION: quantized_layers {module: {quant_algo, group_size}} gives each listed
//     module (or an expert stack by its name) its own algorithm of the above; unlisted modules
//     stay unquantized; an unknown algorithm, a quantized lm_head or router is refused;
//   * W4A8_AWQ, W4A16_AWQ and KV algorithms other than FP8 are refused by name (not read yet);
//   * exclude_modules / ignore: a module stays unquantized when an entry equals its name, is a
//     substring of it (vLLM's legacy rule) or matches it as an fnmatch pattern ("layers.0.mlp*");
//     lm_head and MoE routers never quantize.
// The producer version is recorded as a plan rule; unknown keys become plan warnings.
#include <string>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

// `qc` is either form; `where` names the file ("hf_quant_config.json", "config.json").
QuantPlan plan_from_modelopt_config(const ModelConfig& cfg, const Json& qc,
                                    const std::string& where);

// Whether `qc` is ModelOpt's hf_quant_config.json form (a "quantization" object, no
// quant_method).
bool is_modelopt_hf_quant_config(const Json& qc);

}  // namespace qparity
