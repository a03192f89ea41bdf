#pragma once
// msModelSlim W8A16 (schemes `w8a16-ch` and `w8a16-g<N>`; FORMATS.md §5.2, §5.3, §5.10, card C11).
//
// Tensors per linear shard (names relative to the shard prefix, "model.layers.0.mlp.down_proj"):
//   weight         I8  [N, K]          (U8 accepted: an unsigned open-source checkpoint, §5.10)
//   weight_scale   F32 [N, 1] (channel) or [N, K/G] (group G); F16/BF16 accepted
//   weight_offset  F32 same shape as weight_scale; all zeros for symmetric files
//   bias           F32 [N] optional (msModelSlim writes it as FLOAT)
// The older per-channel spelling [N] of scale/offset loads as found (ParamSpec::alt_shapes).
//
// Precision contract
//   quantize (producer): §5.2 per channel or per group of G along K, symmetric (/127, FLT_EPSILON
//     floor) or asymmetric ((max/255 - min/255), offset = round(-min/s) - 128); q = clamp(round(
//     w/s + offset), -128, 127), offset added BEFORE rounding, round half to even.
//     dialect msmodelslim: every step in fp32 (torch fp32 tensors), division x/s.
//     dialect ideal: qparams in fp64, the scale stored as F32 (RNE), then offset and codes
//     computed in fp64 from the STORED fp32 scale, so dequantize((q, stored s)) is the
//     dequantization of exactly what was rounded.
//     dialects compressed-tensors / vllm / sglang: they produce no msModelSlim files; they use
//     the msmodelslim producer rule (fp32).
//   process: U8 weight + unsigned offset -> subtract 128 from both (§5.10); scales finite > 0;
//     offsets finite; the NPU run-time offset is -offset (kernels compute (q + off_rt)·s, the
//     Ascend loaders negate at load: MindIE atb_llm/utils/quantize/w8a16.py); runtime_tensors()
//     shows the negated offset.
//   apply: y = x @ ((q - offset)·s)^T + bias in fp64. When every offset is integral the codes
//     q - offset are integers and the product is weight_only_gemm (k ascending per scale
//     segment, then ·s); a non-integral offset (possible in an F32 file) is dequantized in fp64
//     and multiplied with matmul_nt. No dialect changes apply (the NPU's fp16/bf16 weight
//     dequantization is not emulated: fp64 is the format's math).
//
// Dialect table (w8a16_rules):
//   step                 ideal                         msmodelslim / ct / vllm / sglang
//   qparams, codes       fp64, scale stored F32,       fp32 (msModelSlim int_quantization.py,
//                        codes from stored scale       §5.2)
//   rounding             half-even                     half-even (torch.round)
//   apply                fp64                          fp64
//
// MoE: the same class serves an expert stack (LinearShape num_experts E, partitions gate/up or
// down); runtime_tensors() then uses SGLang/vllm-ascend names w13_weight [E, 2I, K],
// w13_weight_scale / w13_weight_offset [E, 2I, K/G or 1] (w2_* for down_proj).
#include <memory>

#include "schemes/int/msmodelslim_int.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

struct W8A16Rules {
  MsIntRules qparams;  // producer arithmetic (fp64+stored-scale vs fp32)
};
W8A16Rules w8a16_rules(Dialect d);

// request.group_size: 0 = per channel, else G (must divide K). Symmetric from
// request.weights->symmetric when given, else symmetric. Writes weight I8, weight_scale F32,
// weight_offset F32 (zeros when symmetric), bias F32 when request.bias is set.
TensorMap quantize_w8a16(const QuantizeRequest& request);

// (q - offset) * scale in fp64 from quantize_w8a16's tensors (weight I8 or U8 as written).
Matrix dequantize_w8a16(const TensorMap& tensors, const std::string& where = "w8a16");

class W8A16LinearMethod final : public LinearMethod {
 public:
  W8A16LinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;
  int64_t group_size() const { return group_; }  // K for per channel

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;

 private:
  struct Expert {
    // Signed int8 codes q [N, K] (U8 files shifted by -128), compact, scales [N, K/G]. With
    // integral offsets they are the matrix's zero points, so codes() are q - offset exactly.
    QuantizedMatrix weight;
    Matrix offsets;  // [N, K/G], file convention (q - offset), shifted as q
    bool integral_offsets = true;
    std::vector<double> bias;
    // (q - offset)·s of row r, columns [c0, c0 + out.size()), in fp64 (the non-integral-offset
    // path decodes rows this way).
    void dequantized_row(int64_t r, int64_t c0, std::span<double> out) const;
  };
  int64_t group_ = 0;
  std::vector<Expert> experts_;
};

std::unique_ptr<LinearMethod> make_w8a16_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
