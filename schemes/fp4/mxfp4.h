#pragma once
// Scheme `mxfp4`: compressed-tensors `mxfp4-pack-quantized` (presets MXFP4 = W4A4 with dynamic
// group-32 MX activations, MXFP4A16 = weight-only), spec/FORMATS.md §1.3, §1.4, §2.6(d), §2.8,
// §3.5, §5.9 and card C5.
//
// Tensors per shard:
//   weight_packed  U8  [N, K/2]   two e2m1 codes per byte: element 2j in the low nibble, bit 3 =
//                                 sign (same packing as NVFP4)
//   weight_scale   U8  [N, K/32]  E8M0 byte b: the block scale 2^(b - 127); 255 (NaN) rejected
// No global scale. Dequantize: w = e2m1(q) * 2^(b - 127), exact in fp64 (compressed-tensors'
// decompressor computes it in bf16; exact unless the product is bf16-subnormal).
// Activations (MXFP4, config.input_activations set): per token, per 32-group along K, dynamic,
// with the same dialect rules as the weights (vLLM's MXFP4 emulation path quantizes them with the
// reference QDQ, §3.5). GEMM: e2m1 values on the lattice 0.5, integer-exact block sums
// (scaled_gemm), times 2^(bx - 127) * 2^(bw - 127) (exact).
//
// Precision contract and dialects: see mx_scale.h (shared exponent exact from the double's bits;
// ideal = OCP floor rule + RNE; compressed-tensors / vllm / sglang = the >= 1.75 bump on the amax
// in the model dtype + RNE, byte clamp [0,255] / [0,254]; msmodelslim = its MXFP4 rule
// floor(log2(amax*8/7 + 9.6e-7)) - 2, half-away elements in fp32). quantize rejects a block whose
// exponent byte would be 255 (compressed-tensors would write it; no reader accepts it).
//
// Constraints (Errors naming the tensor): K % 32 == 0, group size 32 in the args, scale byte 255.
// MoE: runtime_tensors() gives w13_weight_packed [E, 2I, H/2], w13_weight_scale [E, 2I, H/32]
// (w2_*: [E, H, I/2], [E, H, I/32]).
#include <memory>

#include "schemes/math/mx_scale.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

// The MXFP4 rules of a dialect (mx_scale_rules with the e2m1 element).
MxScaleRules mxfp4_rules(Dialect d, DType model_dtype);

TensorMap quantize_mxfp4(const QuantizeRequest& req);
Matrix dequantize_mxfp4(const TensorMap& tensors, const std::string& where = "weight");

class Mxfp4LinearMethod final : public MxLinearMethodBase {
 public:
  Mxfp4LinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;

 protected:
  std::string weight_name() const override { return "weight_packed"; }
  std::vector<double> weight_values(int64_t partition, int64_t expert) const override;
};

std::unique_ptr<LinearMethod> make_mxfp4_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
