#pragma once
// Scheme `mxfp8`: compressed-tensors `mxfp8-quantized` (presets MXFP8 = W8A8 with dynamic
// group-32 MX activations, MXFP8A16 = weight-only), spec/FORMATS.md §1.1, §1.4, §2.6(e), §2.8,
// §5.9 and card C5.
//
// Tensors per shard:
//   weight        F8_E4M3  [N, K]     e4m3fn element codes (NaN bytes 0x7F/0xFF rejected)
//   weight_scale  U8       [N, K/32]  E8M0 byte b: the block scale 2^(b - 127); 255 rejected
// Dequantize: w = e4m3(q) * 2^(b - 127), exact in fp64. Activations (MXFP8): per token, per
// 32-group, dynamic, same dialect rules. GEMM: e4m3 values on the lattice 2^-9, integer-exact
// block sums (scaled_gemm), times the two powers of two.
//
// Precision contract and dialects: see mx_scale.h. Elements: clamp to +-448 then RNE (ideal,
// compressed-tensors, vllm, sglang; the clamp comes first, §1.1) or msModelSlim's half-away
// rounding with a private exponent clipped at -6 (its MXFP8 _quant, fp32). Shared exponent:
// ideal and msmodelslim = OCP floor(log2 amax) - 8; compressed-tensors / vllm / sglang = the
// >= 1.75 bump (compressed-tensors uses round_to_power_2 for MXFP8 too, with offset 8).
//
// Constraints (Errors naming the tensor): K % 32 == 0, group size 32 in the args, scale byte
// 255, NaN element bytes. MoE: runtime_tensors() gives w13_weight [E, 2I, H], w13_weight_scale
// [E, 2I, H/32] (w2_*: [E, H, I], [E, H, I/32]).
#include <memory>

#include "schemes/math/mx_scale.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

// The MXFP8 rules of a dialect (mx_scale_rules with the e4m3fn element).
MxScaleRules mxfp8_rules(Dialect d, DType model_dtype);

TensorMap quantize_mxfp8(const QuantizeRequest& req);
Matrix dequantize_mxfp8(const TensorMap& tensors, const std::string& where = "weight");

class Mxfp8LinearMethod final : public MxLinearMethodBase {
 public:
  Mxfp8LinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;

 protected:
  std::string weight_name() const override { return "weight"; }
  std::vector<double> weight_values(int64_t partition, int64_t expert) const override;
};

std::unique_ptr<LinearMethod> make_mxfp8_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
