#pragma once
// Scheme `fp8-tensor`: FP8 E4M3 weights with one scale per tensor (compressed-tensors FP8 preset,
// quant_method "fp8" without weight_block_size). FORMATS.md §1.1, §2.4-2.6(a), §3.1, §3.6, §4.1,
// cards C3, C6, C8; shared rules and the dialect table in fp8_common.h.
//
// Tensors per shard (q/k/v, gate/up, or one expert's shard):
//   weight        F8_E4M3  [N, K]
//   weight_scale  [1]      compressed-tensors: model dtype; quant_method "fp8": F32
//                          (F32/BF16/F16 and the model dtype are all accepted on load)
//   input_scale   [1]      only with static per-tensor activations (same dtypes)
//   bias          [N]      optional, model dtype
// MoE (SGLang run-time names, runtime_tensors()): w13_weight [E, 2I, H], w13_weight_scale F32
// [E] (checkpoint [E, 2]: one per shard, unified below), w2_weight [E, H, I], w2_weight_scale
// [E], w13_input_scale / w2_input_scale [1] (the max over experts, SGLang §4.1).
//
// Precision contract:
//   quantize: s = amax/448 and q = e4m3(clamp(x/s)) per Fp8Rules (fp8_common.h): compressed-
//     tensors in the model dtype (zero -> dtype eps); vllm/sglang = vLLM's online fp8
//     (ops.scaled_fp8_quant, dynamic per tensor: fp32 s, x*(1/s); an all-zero tensor gets s = 0
//     and codes 448, which dequantize to 0); ideal: fp64 s stored once in the storage dtype,
//     codes computed with the stored scale. Static input_scale = amax(calibration)/448 by the
//     same rule (a zero amax gives the storage dtype's eps).
//   process (fused partitions or a gate/up expert pair): max_s = max over partitions; every
//     partition is requantized to max_s (§3.6, §4.1): vllm/sglang dequantize through fp16
//     (per_tensor_dequantize: fp8 -> fp16 times fp32 s, fp32 product rounded to fp16) and
//     requantize x*(1/max_s) in fp32, clamp, RNE - even when the scales are equal, as vLLM does;
//     ideal / compressed-tensors / msmodelslim: exact q*s_i/max_s in fp64, RNE. Each dequantized
//     weight moves by at most one fp8 step at max_s. Static input scales: max over partitions
//     and experts.
//   apply: activations per MethodConfig::input_activations (static tensor, dynamic tensor,
//     dynamic token, or none = weight-only), integer-exact per-tensor GEMM, fp64 epilogue, bias.
#include <memory>

#include "schemes/fp8/fp8_common.h"

namespace qparity::reference {

TensorMap quantize_fp8_tensor(const QuantizeRequest& r, const Fp8QuantizeOptions& o);
TensorMap quantize_fp8_tensor(const QuantizeRequest& r);
// q * weight_scale from a quantize_fp8_tensor() result (weight, weight_scale).
Matrix dequantize_fp8_tensor(const TensorMap& t, const std::string& where = "weight");

// One partition's fp8 values requantized from scale s_i to max_s under the dialect (above).
double fp8_requantize(double q, double s_i, double max_s, const Fp8Rules& rules);

class Fp8TensorLinearMethod final : public Fp8LinearBase {
 public:
  Fp8TensorLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;

 protected:
  void process() override;

 private:
  std::vector<double> unified_scales_;  // per expert
};

std::unique_ptr<LinearMethod> make_fp8_tensor_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
