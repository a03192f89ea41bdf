#pragma once
// Scheme `fp8-channel`: FP8 E4M3 weights with one scale per output channel; activations dynamic
// per token (compressed-tensors FP8_DYNAMIC; msModelSlim WFP8AFP8_DYNAMIC) or unquantized.
// FORMATS.md §1.1, §2.4-2.6(a), §3.1, §4.4, §5.5, cards C3, C6, C13; rules in fp8_common.h.
//
// Tensors per shard:
//   compressed-tensors: weight F8_E4M3 [N, K]; weight_scale [N, 1] model dtype (F32/BF16/F16
//                       accepted); bias [N] model dtype (optional)
//   msModelSlim (MethodConfig::format "msmodelslim"): weight F8_E4M3 [N, K]; weight_scale F32
//                       [N, 1]; weight_offset F32 [N, 1], must be all zero (symmetric); bias F32
// MoE run-time (runtime_tensors()): w13_weight [E, 2I, H], w13_weight_scale F32 [E, 2I, 1];
// w2_weight [E, H, I], w2_weight_scale [E, H, 1]. Fused partitions concatenate their rows and
// scales; nothing is requantized.
//
// Precision contract:
//   quantize: per row s = amax/448, q = e4m3(clamp(x/s)) per Fp8Rules: compressed-tensors in the
//     model dtype, zero row -> dtype eps; vllm/sglang = vLLM's per-token kernel on the weight rows
//     (fp32, x/s, s >= 1/(448*512)) since neither engine produces channel files; msmodelslim
//     fp32, x/s, s >= 2^-23 (UNCONFIRMED); ideal fp64, stored once, zero row -> storage eps.
//   apply: per-token dynamic activations (vllm: fp32 x/s, s >= 1/(448*512); sglang: fp32
//     x*(1/s), no floor, zero row -> codes 0; compressed-tensors: QDQ in the model dtype with
//     eps for zero rows; ideal: exact, zero row -> codes 0), exact integer GEMM per row pair,
//     epilogue acc * s_x[t] * s_w[n] in fp64, bias.
#include <memory>

#include "schemes/fp8/fp8_common.h"

namespace qparity::reference {

TensorMap quantize_fp8_channel(const QuantizeRequest& r, const Fp8QuantizeOptions& o);
TensorMap quantize_fp8_channel(const QuantizeRequest& r);
// q[n, k] * weight_scale[n] from a quantize_fp8_channel() result.
Matrix dequantize_fp8_channel(const TensorMap& t, const std::string& where = "weight");

class Fp8ChannelLinearMethod final : public Fp8LinearBase {
 public:
  Fp8ChannelLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;

 protected:
  void process() override;
};

std::unique_ptr<LinearMethod> make_fp8_channel_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
