#pragma once
// gpt-oss's expert stacks (transformers GptOssExperts; OpenAI's MXFP4 release) seen as the
// per-expert names every loader reads (model.layers.L.mlp.experts.<e>.{gate,up,down}_proj.*).
// The stacks are input-major (x @ W) and interleave gate and up by column, which no row view can
// show, so the expert tensors are copied, byte for byte, into an in-memory image
// (Checkpoint::derived); every other tensor is read in place.
//
//   <s> = model.layers.L.mlp.experts, E experts, H = hidden_size, I = intermediate_size
//   <s>.gate_up_proj       float [E, H, 2I]   -> <s>.<e>.gate_proj.weight [I, H] = gate_up_proj[e]
//                                                 [:, 0::2] transposed; up_proj.weight the
//                                                 odd columns (HF: gate, up = gate_up[..., ::2],
//                                                 gate_up[..., 1::2])
//   <s>.gate_up_proj_bias  float [E, 2I]      -> <s>.<e>.gate_proj.bias [I] (even), up_proj.bias
//                                                 (odd)
//   <s>.down_proj          float [E, I, H]    -> <s>.<e>.down_proj.weight [H, I] = down_proj[e]^T
//   <s>.down_proj_bias     float [E, H]       -> <s>.<e>.down_proj.bias [H]
// MXFP4 (quantization_config.quant_method "mxfp4"; transformers integrations/mxfp4.py
// convert_moe_packed_tensors, vLLM gpt_oss.py): output-major, 32 e2m1 codes per block,
// element 2j in the low nibble (the compressed-tensors mxfp4 packing, schemes/fp4/mxfp4.h):
//   <s>.gate_up_proj_blocks U8 [E, 2I, H/32, 16] -> <s>.<e>.{gate,up}_proj.weight_packed
//                                                   [I, H/2]: rows 0::2 (gate), 1::2 (up)
//   <s>.gate_up_proj_scales U8 [E, 2I, H/32]     -> <s>.<e>.{gate,up}_proj.weight_scale [I, H/32]
//                                                   (E8M0: 2^(b - 127))
//   <s>.down_proj_blocks    U8 [E, H, I/32, 16]  -> <s>.<e>.down_proj.weight_packed [H, I/2]
//   <s>.down_proj_scales    U8 [E, H, I/32]      -> <s>.<e>.down_proj.weight_scale [H, I/32]
// A stack tensor of another shape or dtype, or one half of a blocks / scales pair, is an Error
// naming it. Per-expert names already on disk (a checkpoint whose experts were written as
// linears) pass through unchanged.
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/safetensors/checkpoint.h"

namespace qparity {

// The view of a gpt-oss checkpoint under per-expert names (unchanged for other architectures).
Checkpoint gpt_oss_expert_view(Checkpoint raw, const ModelConfig& cfg);

// The inverse, for writers: a stack's tensors from per-expert ones. `per_expert[e]` holds expert
// e's gate, up and down tensors of one kind ("weight": float [I, H], [I, H], [H, I]; "bias":
// [I], [I], [H]; "weight_packed" / "weight_scale": U8 as above) as raw element bytes; the result
// is the stack's two tensors (gate_up_*, down_*) with their gpt-oss names and shapes.
struct GptOssStackTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};
struct GptOssExpertTensors {
  DType dtype;
  std::vector<uint8_t> gate, up, down;
};
std::vector<GptOssStackTensor> gpt_oss_stack_tensors(
    const ModelConfig& cfg, int64_t layer, const std::string& kind,
    const std::vector<GptOssExpertTensors>& experts);

}  // namespace qparity
