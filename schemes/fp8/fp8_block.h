#pragma once
// Scheme `fp8-block`: FP8 E4M3 weights with one scale per 128x128 tile; activations dynamic per
// token and 1x128 group (compressed-tensors FP8_BLOCK; HF/DeepSeek quant_method "fp8" with
// weight_block_size [128, 128]). FORMATS.md §1.1, §2.3, §2.5, §2.6(a), §3.2, §4.1, §4.4, cards
// C3, C6, C8; rules in fp8_common.h.
//
// Tensors per shard:
//   weight            F8_E4M3 [N, K]
//   weight_scale      [ceil(N/128), ceil(K/128)] model dtype (compressed-tensors)
//   weight_scale_inv  [ceil(N/128), ceil(K/128)] F32 (quant_method "fp8", MethodConfig::format
//                     "fp8"): a multiplier despite its name, w = q * weight_scale_inv
//   bias              [N] optional
// MoE run-time (runtime_tensors()): w13_weight [E, 2I, H], w13_<scale name> F32
// [E, 2*ceil(I/128), ceil(H/128)]; w2_weight [E, H, I], w2_<scale name> [E, ceil(H/128),
// ceil(I/128)].
//
// Ragged edges: N and K need not be multiples of 128 (compressed-tensors' scale grid is
// [ceil(N/128), ceil(K/128)]). Edge tiles are partial: their scale comes from the amax of the
// rows/columns that exist (compressed-tensors pads with zeros and crops; llm-compressor's
// observer pads with the tile's mean; neither raises the amax). The last 1x128 activation group
// of a row is partial likewise under ideal (as vLLM's torch-native QuantFP8 path, which pads
// with zeros).
// Dialect constraints (do_check_shape, before any weight; errors name the checkpoint tensor):
//   vllm, sglang, compressed-tensors: K % 128 == 0 for the dynamic 1x128 activation groups
//     (vLLM fp8_utils.py and SGLang fp8_kernel.py per_token_group_quant_fp8 assert
//     x.shape[-1] % group_size == 0; compressed-tensors helpers.py
//     compute_dynamic_scales_and_zp unflattens K into (ceil(K/128), 128)).
//   vllm, sglang: fused partitions (q/k/v, gate/up) - every partition but the last must be a
//     multiple of 128 rows (validate_fp8_block_shape, vLLM fp8_utils.py and SGLang fp8_utils.py:
//     "In case of merged matrices, we allow the last matrix to not be a multiple of block
//     size"). With tensor parallelism vLLM also needs K_per_rank % 128 == 0 (row parallel) and
//     every N_per_rank % 128 == 0; qparity runs TP = 1, so these are documented, not checked.
//   sglang MoE: I % 128 == 0 for w13 (gate/up rows) and w2 (its K) (§4.1).
//   ideal: any shape. msmodelslim has no block fp8.
//
// Precision contract:
//   quantize: per tile s = amax/448, q = e4m3(clamp(x/s)) (Fp8Rules): compressed-tensors in the
//     model dtype (zero tile -> eps); vllm/sglang = vLLM's group kernel on tiles (fp32,
//     amax >= 1e-10, x/s); ideal fp64 stored once in the storage dtype.
//   apply: activations per token-group of 128 (vllm fp32 max(amax,1e-10)/448, x/s; sglang
//     row-major x*(1/s); optional UE8M0 scales 2^ceil(log2 s) via Fp8Rules::group_ue8m0; ideal
//     exact), integer-exact sums per 128-column segment (scaled_gemm), each scaled by
//     s_x[t, seg] * s_w[tile(n), seg] in fp64 and summed in ascending k, bias.
#include <memory>

#include "schemes/fp8/fp8_common.h"

namespace qparity::reference {

TensorMap quantize_fp8_block(const QuantizeRequest& r, const Fp8QuantizeOptions& o);
TensorMap quantize_fp8_block(const QuantizeRequest& r);
// q * tile scale from a quantize_fp8_block() result (weight_scale or weight_scale_inv).
Matrix dequantize_fp8_block(const TensorMap& t, const std::string& where = "weight");

class Fp8BlockLinearMethod final : public Fp8LinearBase {
 public:
  Fp8BlockLinearMethod(LinearShape shape, MethodConfig config);
  // With explicit rules (e.g. group_ue8m0 set).
  Fp8BlockLinearMethod(LinearShape shape, MethodConfig config, Fp8Rules rules);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  // "weight_scale" or "weight_scale_inv".
  std::string scale_name() const;

 protected:
  void process() override;

 private:
  void do_check_shape() const override;
  std::vector<Matrix> checkpoint_scales_;  // per expert, partitions' grids stacked
};

std::unique_ptr<LinearMethod> make_fp8_block_method(LinearShape shape, MethodConfig config);
std::unique_ptr<LinearMethod> make_fp8_block_method(LinearShape shape, MethodConfig config,
                                                    Fp8Rules rules);

}  // namespace qparity::reference
