#pragma once
// The GPTQ checkpoint layout (AutoGPTQ / GPTQModel / Optimum, quant_method "gptq"; docs/GPTQ-AWQ.md
// has the sources) of one linear [N, K] with b-bit codes, as a reader and a writer onto the same
// IntWeight the compressed-tensors pack-quantized method uses (so the reference's apply, the
// fusion and the GPU repack are shared):
//   qweight  I32 [K*b/32, N]   column n holds the K unsigned codes u[k, n] in [0, 2^b) as a
//                              little-endian bit stream along K (code k at bits [k*b, k*b+b)):
//                              8 per word for int4, and for b = 3 the 32-codes-in-3-words packing
//                              of AutoGPTQ's pack(), which is the same stream; K*b % 32 == 0.
//   qzeros   I32 [G, N*b/32]   row g holds the N stored zero points the same way along N.
//                              checkpoint_format "gptq" (v1, AutoGPTQ) stores z - 1 and every
//                              reader adds 1 to the masked field (vLLM's q_gemm.cu, AutoGPTQ's
//                              dequant); z = 0 cannot be stored (its -1 spills into the fields
//                              above), so an all-ones field is an Error; "gptq_v2" (GPTQModel)
//                              stores z.
//   scales   F16 [G, N]        (BF16 / F32 accepted: GPTQModel may keep the model dtype)
//   g_idx    I32 [K]           group of each column (desc_act: the act-order permutation's
//                              groups; otherwise k / group_size, and vLLM ignores it - so here
//                              it must be column order when desc_act is false).
//   bias     optional [N]
// w[n, k] = (u[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]; G = K / group_size (group_size -1:
// one group). In IntWeight terms q = u - 2^(b-1) and zero = z - 2^(b-1), so (q - zero) = u - z.
// sym checkpoints store z = 2^(b-1) (v1: 0x77777777 for int4); vLLM's Marlin path then ignores
// qzeros and uses 2^(b-1), so a symmetric checkpoint whose qzeros say otherwise is an Error (the
// engines would disagree on it).
#include <functional>
#include <string>
#include <vector>

#include "schemes/int/pack_quantized_int.h"

namespace qparity::reference {

enum class GptqZeroFormat : uint8_t { kV1, kV2 };  // checkpoint_format gptq / gptq_v2

// Scales stored group-major [G, N] (GPTQ's and AWQ's `scales`) as IntWeight's [N, G]: finite and
// > 0, else an Error naming `where` and the element.
Matrix group_major_scales(const HostTensor& t, int64_t n, int64_t groups, const std::string& where);

std::vector<ParamSpec> gptq_specs(const QuantArgs& a, int64_t n, int64_t k,
                                  std::vector<DType> scale_dtypes);

IntWeight decode_gptq(const std::function<const HostTensor*(const std::string&)>& get,
                      const std::function<std::string(const std::string&)>& where,
                      const QuantArgs& a, GptqZeroFormat zeros, int64_t n, int64_t k);

// The tensors of `w` in the GPTQ layout; scales encoded in `scale_dtype` (round to nearest once),
// g_idx always written (column order without act order, as AutoGPTQ does). v1 cannot store a
// zero point of 0 (it would be -1, which AutoGPTQ's packing spills into the neighbouring
// fields): an Error naming the tensor and group; write gptq_v2.
TensorMap encode_gptq(const IntWeight& w, int bits, GptqZeroFormat zeros, DType scale_dtype,
                      const std::string& where);

// GPTQ's round-to-nearest quantizer (AutoGPTQ quant/quantizer.py Quantizer.find_params with
// perchannel, then quantize): per row and group, xmin = min(min(x), 0), xmax = max(max(x), 0);
// sym: xmax = max(|xmin|, xmax), xmin = -xmax; both 0: xmin = -1, xmax = 1;
// scale = (xmax - xmin) / (2^b - 1); zero = 2^(b-1) (sym) or round(-xmin / scale);
// u = clamp(round(x / s) + zero, 0, 2^b - 1), torch.round (half to even), with s the scale as
// stored in `scale_dtype` (AutoGPTQ's pack() recomputes the codes from the fp16 scales the same
// way). GPTQ's Hessian update is out of scope: these are the codes GPTQ starts from. `exact`:
// scale and zero in fp64, the quotient's rounding decided exactly (the ideal dialect); otherwise
// in fp32 as AutoGPTQ computes them (W.float()). Act order: the groups `group` gives (a
// permutation's groups of group_size columns each); empty: k / group_size.
IntWeight quantize_gptq_rtn(const Matrix& weight, int bits, int64_t group_size, bool symmetric,
                            std::vector<int64_t> group, DType scale_dtype, bool exact,
                            const std::string& where);

}  // namespace qparity::reference
