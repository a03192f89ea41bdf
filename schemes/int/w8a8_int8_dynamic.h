#pragma once
// Scheme `w8a8-int8-dyn`: INT8 weights, INT8 activations, integer GEMM (FORMATS.md §2.6(a),
// §3.3, §4.5, §5.5; cards C2, C7, C13).
//
// Tensors per shard (N = out_features of the shard, K = in_features):
//   compressed-tensors `int-quantized` (INT8_W8A8 preset; MethodConfig.format != "msmodelslim"):
//     weight            I8 [N, K]
//     weight_scale      model dtype (BF16/F16/F32 accepted) [N, 1] (channel) | [1] (tensor)
//     input_scale       [1], only when input_activations are static (strategy tensor)
//     input_zero_point  I8 [1], static asymmetric inputs only
//     bias              optional, model dtype
//   msModelSlim W8A8_DYNAMIC (MethodConfig.format == "msmodelslim"; quantize(): request.dialect
//   == msmodelslim):
//     weight I8 [N, K], weight_scale F32 [N, 1], weight_offset F32 [N, 1] (must be all zero:
//     symmetric weights; a nonzero offset is an error naming the tensor), bias F32 [N] optional.
//
// Precision contract:
//   * GEMM: y[t,n] = acc[t,n] * s_x[t] * s_w[n] + b[n], acc = sum_k (qx - zx)[t,k] * qw[n,k] as an
//     exact integer (scaled_gemm with the int32 accumulator check: a sum outside int32 is an
//     error, as the hardware accumulator would wrap). The epilogue product is fp64 here; real
//     kernels (cutlass / int8_scaled_mm / npu_quant_matmul) do it in fp32 - not emulated.
//   * Weight quantize: int_weight_rules() (pack_quantized_int.h): compressed-tensors s =
//     amax/127.5 computed in the model dtype (bf16: fp32 op then round to bf16), x/s in the model
//     dtype, clamp to [-128, 127], round half-even, zero scale -> finfo(dtype).eps (§2.4 step 7).
//     ideal: amax/127.5 exact, rounded once to the storage dtype, codes from the stored scale.
//     msmodelslim: amax/127 in fp32, max(s, FLT_EPSILON) (§5.2). vllm/sglang have no weight
//     producer and use the compressed-tensors rules.
//   * Activation quantization (per token unless static), Int8ActRules:
//     dialect    scale              codes                                    all-zero token
//     ideal      amax/127 exact     RNE(x/s) exact, clamp                    s = 1, q = 0
//     ct         amax/127.5 in the  RNE(x/s) in the model dtype, clamp       s = dtype eps
//                model dtype        (real per-token semantics, not the 2-D quirk of §2.4)
//     vllm       amax/127 fp32      cvt.rni.sat(x * (127/amax)) fp32 (§3.3)  s = 0, q = 0
//     sglang     max(amax,1e-10)/127 half-away(x * (127/absmax)) fp32 (§4.5)  s = 1e-10/127
//     msmodelslim amax/127 fp32     RNE(x/s) fp32, clamp: npu_dynamic_quant  s = 0, q = 0
//                                   (UNCONFIRMED: op source not available, §7 item 5)
//     Static input scales (compressed-tensors only): q = clamp(round(x/s) + z): ideal the exact
//     quotient x/s rounded once (ties decided exactly), then z; ct x/s + z in the model dtype,
//     then round (compressed-tensors' fake-quant order); vllm symmetric rn_sat(x / s) in fp32
//     (static_scaled_int8_quant_kernel, §3.3), asymmetric sat(rint_int32(x * fp32(1/s)) + z)
//     (static_scaled_int8_azp_quant_kernel: reciprocal, then the integer add, not a float sum
//     rounded first); msmodelslim x/s + z in fp32. GEMM codes are q - z (exact: equals vLLM's
//     azp_adj folding). SGLang ignores a
//     static input_scale and always quantizes per token (§4.5; compressed_tensors_w8a8_int8.py
//     apply_weights) - the sglang dialect does the same.
//     Fused partitions' static input scales: symmetric -> max; asymmetric -> vLLM/SGLang range
//     reconstruction (range_max/min over partitions, s = (max - min)/255, azp = trunc(-128 -
//     min/s)), fp64 for ideal, fp32 otherwise.
//   * Tensor-strategy weights on fused partitions (one scale per partition):
//     ideal/ct/vllm/msmodelslim: every row keeps its partition's scale (exact; this is vLLM's
//     convert_to_channelwise in CompressedTensorsW8A8Int8).
//     sglang: requantize_with_max_scale (sglang layers/quantization/utils.py, scheme
//     compressed_tensors_w8a8_int8.py @0fbab45d) - even for a single partition: w_dq =
//     fp16(q) * s_p in fp16, then scaled_fp8_quant(w_dq, max_s) = e4m3fn(RNE, clamp 448) of
//     w_dq * (1/max_s) in fp32, assigned into the int8 weight (float -> int8: toward zero,
//     saturating; UNCONFIRMED for 128 - the CUDA cast). The codes thus pass through fp8 and lose
//     precision (127 -> 128 -> 127, 100 -> 96). The s_p -> fp16 rounding is also UNCONFIRMED.
#include <memory>
#include <optional>

#include "schemes/math/numeric.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

enum class ZeroTokenScale : uint8_t { kOne, kZero, kDtypeEps };

struct Int8ActRules {
  Dialect dialect = Dialect::kIdeal;
  Arith arith = Arith::kFp64;      // precision of the per-token steps (unless model_dtype_arith)
  bool model_dtype_arith = false;  // compressed-tensors: the activation's own dtype
  double divisor = 127.0;          // 127 (engines) or 127.5 (compressed-tensors)
  bool multiply_divisor_over_amax = false;  // vllm/sglang: q = x * (127/amax)
  IntRound round = IntRound::kHalfEven;
  double amax_floor = 0.0;  // sglang 1e-10
  ZeroTokenScale zero_token = ZeroTokenScale::kOne;
  bool ignores_static_input = false;  // sglang: always dynamic per token
  // vllm: static asymmetric inputs as its azp kernel computes them (header comment).
  bool static_azp_reciprocal_then_add = false;
  bool tensor_requant_via_fp8 = false;  // sglang requantize_with_max_scale
};

Int8ActRules int8_act_rules(Dialect d);

// Per-token INT8 codes [T, K] with scales [T, 1] (lattice 1, zero points 0).
QuantizedMatrix quantize_int8_per_token(const Matrix& x, const Int8ActRules& r, DType model_dtype);
// Static per-tensor codes: q - z with q = clamp(round(x/s) + z) in the dialect's arithmetic
// (header comment); scales all s. `asymmetric`: the config's inputs are asymmetric (vLLM then
// takes its azp kernel, even for z = 0).
QuantizedMatrix quantize_int8_static(const Matrix& x, double scale, int64_t zero_point,
                                     bool asymmetric, const Int8ActRules& r, DType model_dtype);

// SGLang's requantize_with_max_scale applied to one int8 code with partition scale s_p and the
// layer's max scale (see the header comment).
int64_t sglang_int8_requant_code(int64_t q, double s_p, double max_s);

// Weights: request.weights or INT8_W8A8 (channel, symmetric); inputs: request.input_activations
// or dynamic per token. Static inputs need request.activations (min/max). request.dialect ==
// msmodelslim writes the msModelSlim W8A8_DYNAMIC tensors instead.
TensorMap quantize_w8a8_int8_dynamic(const QuantizeRequest& request);
// The fp64 weight q * s of a quantize result (either naming).
Matrix dequantize_w8a8_int8_dynamic(const TensorMap& tensors, const std::string& where = "weight");

class W8A8Int8DynamicLinearMethod final : public LinearMethod {
 public:
  W8A8Int8DynamicLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  const Int8ActRules& act_rules() const { return act_; }
  bool static_input() const { return static_input_ && !act_.ignores_static_input; }
  // Static inputs: the processed per-tensor scale and zero point of an expert (0 for a dense
  // layer), and whether the config's inputs are asymmetric.
  double input_scale(int64_t expert) const { return input_scale_.at(static_cast<size_t>(expert)); }
  int64_t input_zero_point(int64_t expert) const {
    return input_zero_.at(static_cast<size_t>(expert));
  }
  bool input_symmetric() const { return input_symmetric_; }
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;

 private:
  bool msmodelslim_ = false;
  bool channel_ = true;
  bool static_input_ = false;
  bool input_symmetric_ = true;
  Int8ActRules act_;
  std::vector<QuantizedMatrix> weights_;  // per expert, fused [N, K], scales [N, 1]
  std::vector<double> input_scale_;       // per expert (static)
  std::vector<int64_t> input_zero_;       // per expert (static)
  std::vector<std::vector<double>> biases_;
};

std::unique_ptr<LinearMethod> make_w8a8_int8_dynamic_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
