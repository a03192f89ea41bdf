#pragma once
// Scheme `nvfp4`: compressed-tensors `nvfp4-pack-quantized` (presets NVFP4 = W4A4 and NVFP4A16 =
// weight-only), spec/FORMATS.md §1.3, §2.3, §2.7, §3.4, §4.2, §6 and cards C4, C9.
//
// Tensors per shard (one linear, or one expert's gate/up/down projection):
//   weight_packed        U8       [N, K/2]   two e2m1 codes per byte: element 2j in the low
//                                            nibble, 2j+1 in the high one; bit 3 = sign
//   weight_scale         F8_E4M3  [N, K/16]  per-16 block scale, already multiplied by gs_w
//   weight_global_scale  F32      [1]        gs_w = 448*6 / amax(W): a DIVISOR
//   input_global_scale   F32      [1]        gs_in = 448*6 / amax(calibration inputs); only when
//                                            the config has input activations (W4A4); a divisor
// Dequantize: w = e2m1(q) * s_w / gs_w. Activations (W4A4): per 16-group dynamic scale
// s_x = e4m3(gs_in * amax16 / 6) with the static gs_in, q_x = e2m1(clamp(x * gs_in / s_x, +-6)).
// GEMM: y = sum over 16-groups of dot(q_x, q_w) * (s_x / gs_in) * (s_w / gs_w): e2m1 values sit
// on the lattice 0.5, so each group's dot product is an exact integer sum (scaled_gemm); the
// per-group factors are fp64 products (one rounding each). The engine's fp32 alpha
// (1/gs_in)(1/gs_w) and its fp32 tensor-core accumulation are not emulated.
//
// Precision contract. e2m1 rounding is RNE on the grid {0,.5,1,1.5,2,3,4,6} saturating at 6
// (ties 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4); e4m3 scales RNE with
// saturation at 448 (clamp before the cast, §1.1). The ideal dialect decides every e2m1 code
// exactly (the sign of x*gs - t*s is computed exactly with an fma), the others compute the
// scaled value in fp32 as their source does, then round it RNE.
//
// Dialects (nvfp4_rules):
//   step                     ideal            compressed-tensors  vllm / sglang       msmodelslim
//   global scale             2688/amax fp64,  (1/amax)*2688, torch's float / Tensor: in the
//                            (producer: in the model dtype for compressed-tensors, then to F32)
//   global scale (fp32)                       (1/amax)*2688 in fp32: torch evaluates the
//                            one RNE to F32   producers' `448.0 * 6.0 / amax` as reciprocal
//                                             times 2688 (CT generate_gparam §2.7, vLLM
//                                             nvfp4_utils); msmodelslim = CT
//   weight block scale       e4m3(gs*a/6),    e4m3(fl32(gs *      e4m3(gs*(a*fl32(1/6)))  = CT
//                            one rounding     fl32(a/6)))         in fp32 (test ref, §3.4)
//   zero block scale         0.125            0.125 (eps, §2.4.7) 0 (1/0 -> 0 in the ref)  0.125
//   element scaling          exact x*gs/s     x/(s/gs) in fp32    x*fl32(1/(s*(1/gs))), with  = CT
//                                                                 1/0 -> 0 (test reference)
//   fused gs, dense q/k/v    own per          own per partition   weight gs = max, input     own
//                            partition        (decompressor)      gs = max (§3.4; SGLang's
//                                                                 linear scheme is vLLM's)
//   fused gs, MoE gate/up    own per shard    own per shard       weight gs = shard 0, input own
//                                                                 gs = min of the 2 shards
//                                                                 (§4.2; vLLM's CT MoE does
//                                                                 the same: 1/gs_in .max)
// The vllm dialect reproduces vLLM's test reference (ref_nvfp4_quant), not the CUDA kernel: the
// kernel's rcp.approx.ftz reciprocals are not bit-reproducible on a CPU. msModelSlim has no NVFP4
// rule of its own read here; its dialect uses compressed-tensors' (producer) arithmetic and the
// exact per-partition loader semantics. Where the engine rule reconciles fused global scales
// (max / shard 0), the fp8 block scales were made with each partition's own gs, so the result is
// inexact; that inexactness is what the vllm / sglang dialects report.
//
// MoE: the same class serves an expert stack (shape.num_experts > 0); runtime_tensors() gives
// SGLang's names: w13_weight_packed [E, 2I, H/2], w13_weight_scale [E, 2I, H/16],
// w13_weight_global_scale [E, 2], w13_input_global_scale [E, 2] (w2_*: [E, H, I/2], [E, H, I/16],
// [E], [E]); and, for the unifying dialects, w13_weight_scale_2 = 1/gs_w and w13_input_scale =
// 1/gs_in after unification ([E], F32).
//
// ModelOpt's NVFP4 export (MethodConfig::format "modelopt", docs/MODELOPT.md): `weight` U8
// [N, K/2] (the same nibbles), `weight_scale` F8_E4M3 [N, K/16], `weight_scale_2` F32 0-dim =
// amax / 2688 and, W4A4, `input_scale` F32 0-dim: MULTIPLIERS, w = e2m1(q) * s_w * ws2 (an exact
// fp64 product). The activation codes take the divisor gs_in = fl32(1 / input_scale), vLLM's
// input_global_scale_inv, and their block factors are s_x * input_scale; the effective global
// scales an engine reads are fl32(1 / ws2) and gs_in. Fused layers under vllm / sglang follow
// vLLM's ModelOpt rule: the largest weight_scale_2 and input_scale of a dense fused layer, the
// gate's weight_scale_2 and the largest input_scale of an expert's gate/up.
//
// Constraints (Errors naming the tensor): K % 16 == 0 (so K is even), group size 16 in the args,
// scale bytes not NaN (0x7F / 0xFF), global scales finite and > 0.
#include <memory>
#include <optional>
#include <vector>

#include "schemes/math/numeric.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

inline constexpr int64_t kNvfp4GroupSize = 16;
inline constexpr double kNvfp4GlobalNumerator = 448.0 * 6.0;  // 2688

enum class Nvfp4ElementScaling : uint8_t {
  kExact,           // q = e2m1(x * gs / s), decided exactly
  kDivideFp32,      // t = fl32(x / fl32(s / gs))                (compressed-tensors)
  kReciprocalFp32,  // t = fl32(x * fl32(1 / fl32(s * fl32(1/gs))))  (vLLM test reference)
};
enum class Nvfp4BlockScale : uint8_t {
  kExact,             // e4m3(gs * amax / 6), one rounding
  kDivideFp32,        // e4m3(fl32(gs * fl32(amax / 6)))
  kReciprocalSixFp32  // e4m3(fl32(gs * fl32(amax * fl32(1/6))))
};
enum class Nvfp4FusedGlobal : uint8_t {
  kPerPartition,      // each partition keeps its own gs (the format's semantics)
  kMax,               // max weight gs and max input gs over the partitions (vLLM linear)
  kShardZeroMinInput  // weight gs of shard 0, min input gs (SGLang / vLLM NVFP4 MoE)
};

struct Nvfp4Rules {
  Arith global_scale_arith = Arith::kFp64;  // fp64: 2688/amax; fp32: (1/amax)*2688 (torch)
  Nvfp4BlockScale block_scale = Nvfp4BlockScale::kExact;
  Nvfp4ElementScaling element = Nvfp4ElementScaling::kExact;
  // A block scale that rounds to 0: 0.125 (compressed-tensors' fp8 eps, also used by ideal and
  // msmodelslim) or kept 0 (vLLM's test reference; the element scale is then 1/0 -> 0).
  double zero_block_scale = 0.125;
  Nvfp4FusedGlobal dense_fused = Nvfp4FusedGlobal::kPerPartition;
  Nvfp4FusedGlobal moe_fused = Nvfp4FusedGlobal::kPerPartition;
  // The arithmetic of the producer's observer statistics when global_scale_arith is fp32:
  // compressed-tensors keeps the observed min/max in the weight's (activation's) dtype, so
  // 2688/amax (reciprocal, then times 2688) and amax/6 are computed in it (bf16 for a bf16
  // model) before the fp32 product gs * (amax/6) (helpers.py calculate_qparams / generate_gparam,
  // observers/min_max.py). vLLM's reference and nvfp4_rules() alone: fp32.
  Arith observer_arith = Arith::kFp32;
};

Nvfp4Rules nvfp4_rules(Dialect d);
// The rules a producer writes weights (and static input global scales) with: nvfp4_rules, and
// under compressed-tensors / msmodelslim the observer arithmetic of the model dtype.
Nvfp4Rules nvfp4_producer_rules(Dialect d, DType model_dtype);

// gs = 2688 / amax in the rules' arithmetic, rounded to F32; NaN / inf / 0 -> 1.
double nvfp4_global_scale(double amax, const Nvfp4Rules& r);
// The e4m3 block scale for a 16-group with this amax (0 -> 0.125).
double nvfp4_block_scale(double amax16, double global_scale, const Nvfp4Rules& r);
// The e2m1 value (in [-6, 6]) of x in a block with scale s and global scale gs.
double nvfp4_quantize_element(double x, double block_scale, double global_scale,
                              const Nvfp4Rules& r);
// Exact RNE e2m1 of x * g / s (s > 0), saturating at 6: the ideal element rounding.
double e2m1_of_scaled_exact(double x, double g, double s);

// Activation quantization of x [T, K] with a static input global scale: codes on the lattice
// 0.5, block 1 x 16, scales s_x / gs_in.
// `dequant_multiplier` > 0 (ModelOpt's input_scale): the codes are those of input_global_scale,
// the block factors s_x * dequant_multiplier instead of s_x / input_global_scale.
QuantizedMatrix nvfp4_quantize_activation(const Matrix& x, double input_global_scale,
                                          const Nvfp4Rules& r, double dequant_multiplier = 0.0);

// weight_packed / weight_scale / weight_global_scale (+ input_global_scale when
// req.input_activations is set; it then needs req.activations).
TensorMap quantize_nvfp4(const QuantizeRequest& req);
// ModelOpt's NVFP4 export (>= 0.35 formulas, with 0.45's block-scale clamp; every step in fp32
// as its NVFP4QTensor computes it): ws2 = amax / 2688 (the fused group's amax), s = e4m3(clamp(
// block_amax / (6 * ws2), 2^-9, 448)) with 0 -> 1.0, q = e2m1(x / (s * ws2)); `weight`,
// `weight_scale`, `weight_scale_2` (0-dim) and with input activations `input_scale` = fl32(amax
// / 2688) of the calibration statistics (0-dim).
TensorMap quantize_nvfp4_modelopt(const QuantizeRequest& req);
// The weight [N, K] the tensors of one shard hold: e2m1(q) * s / gs.
Matrix dequantize_nvfp4(const TensorMap& tensors, const std::string& where = "weight");

class Nvfp4LinearMethod final : public LinearMethod {
 public:
  Nvfp4LinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  const Nvfp4Rules& rules() const { return rules_; }
  bool quantizes_activations() const { return act_; }
  // After processing: the weight / input global scale partition p of `expert` is used with.
  double effective_weight_global_scale(int64_t expert, int64_t partition) const;
  double effective_input_global_scale(int64_t expert, int64_t partition) const;
  // What a device upload takes after processing: expert e's codes over all its partitions
  // [N, K] (lattice 0.5, blocks [1, 16]) with the stored e4m3 block scales s_w as scales, not
  // divided by any global scale (a kernel applies 1/gs once per output, as vLLM's alpha does),
  // and its bias.
  QuantizedMatrix processed_codes(int64_t expert) const;
  const std::vector<double>& processed_bias(int64_t expert) const {
    return experts_.at(static_cast<size_t>(expert)).bias;
  }

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;
  std::vector<std::string> retained_after_processing() const override {
    return {"weight_scale", "weight_global_scale", "input_global_scale"};
  }

 private:
  struct Expert {
    std::vector<QuantizedMatrix> parts;  // per partition [n_p, K], scales s_w / gs_w_eff
    std::vector<double> weight_gs;       // as stored, per partition
    std::vector<double> input_gs;        // as stored, per partition (W4A4)
    std::vector<double> weight_gs_eff;   // after the dialect's fused-layer rule
    std::vector<double> input_gs_eff;
    std::vector<double> input_mult_eff;  // ModelOpt: input_scale after the rule, else empty
    std::vector<double> bias;
  };
  Nvfp4Rules rules_;
  bool act_ = false;
  bool modelopt_ = false;  // ModelOpt's tensor names and multiplier scales
  std::vector<Expert> experts_;
};

std::unique_ptr<LinearMethod> make_nvfp4_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
