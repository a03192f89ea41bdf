#pragma once
// msModelSlim W8A8 static (schemes `w8a8-static` and `w8a8s`; FORMATS.md §5.2, §5.4, §5.6, card
// C12). W8A8S is the same math with a weight from the sparse quantizer (many zeros): one class.
//
// Tensors per linear shard (names relative to the shard prefix):
//   weight         I8  [N, K]   symmetric per channel, scale_w = max(amax/127, 2^-23)
//   input_scale    F32 [1]      asymmetric per-tensor activation scale (F16/BF16 accepted)
//   input_offset   F32 [1]      integral, in [-128, 127] (F16/BF16/I8 accepted)
//   deq_scale      I64 [N]      fp32 bit pattern in the low 32 bits (fp16 models), or
//                  F32 [N]      (bf16 models); = input_scale · scale_w[n] in fp32
//   quant_bias     I32 [N]      round(bias/deq_scale - input_offset · Σ_k q_w[n,k])
//   weight_scale, weight_offset  F32 [N, 1]  optional (v0 writes them, offsets zero; v1 does not)
//   bias           F32 [N]      optional, ALREADY FOLDED into quant_bias: apply never adds it.
//     (vllm-ascend `w8a8_static.py` 1031b861 `apply` passes quant_bias to npu_quant_matmul and
//     ignores the layer bias for msModelSlim files; MindIE W8A8LinearStatic registers `bias` but
//     the static op takes quant_bias.)
//
// Precision contract
//   quantize (producer, from request.activations min/max): §5.2 asymmetric per-tensor
//     input_scale/offset; weights symmetric per channel; deq_scale = input_scale·scale_w;
//     quant_bias rounded half-to-even (torch.round); a quant_bias outside int32 is an Error.
//     dialect msmodelslim (and ct/vllm/sglang, which produce no such files): every step in fp32.
//     dialect ideal: qparams in fp64; input_scale stored as F32; scale_w kept in fp64 (v1 does not
//     store it) and the weight codes rounded with it; deq_scale = F32(stored input_scale ·
//     scale_w); quant_bias from the stored deq_scale in fp64.
//     deq_scale is written I64 when model_dtype is F16 and F32 otherwise (bf16 / fp32 models).
//   process: input_scale finite > 0; input_offset integral in [-128, 127]; every partition of a
//     fused layer (same input) carries the same input_scale and input_offset (else Error: the
//     NPU quantizes x once); deq_scale decoded by its FILE dtype (I64: low 32 bits as fp32, the
//     high 32 bits must be the sign extension the saver writes), finite > 0; optional
//     weight_scale finite > 0.
//   apply:  x_q = clamp(round(x·(1/s) + off)) or round(x/s + off) (dialect), half-to-even
//           acc = x_q @ q_w^T  EXACT (128-bit; a sum outside int32 is an Error: NPU int32)
//           acc += quant_bias  (must stay inside int32)
//           y = acc · deq_scale[n]  in fp64 (the NPU then casts to the model dtype: not done)
//     dequantized_weight(): q_w · deq_scale/input_scale (the effective weight scale), so
//       apply(x) = (x_q - off)·s_in @ dequantized_weight^T + (quant_bias + off·Σq_w)·deq_scale.
//     quantize_input(): the RAW int8 codes x_q (offset NOT subtracted; the NPU GEMM takes them
//       raw and the offset lives in quant_bias), scales = input_scale per row. Its value() is
//       therefore x_q·s_in, not the dequantized activation (x_q - off)·s_in.
//
// Dialect table (w8a8_static_rules):
//   step                  ideal                   msmodelslim / sglang / ct   vllm
//   producer arithmetic   fp64 (+F32 storage)     fp32                        fp32
//   input_scale at load   F32 as stored           F32 as stored               rounded to model
//                                                                             dtype (vllm-ascend
//                                                                             allocates it in
//                                                                             params_dtype)
//   activation scaling    x / s, fp64             x·(1/s) in fp32 (npu_quantize, §5.4), 1/s in
//                                                 fp32 (model dtype for vllm: `1 / tensor`)
//   activation rounding   half-even               half-even (NPU rounding UNCONFIRMED, §7.5)
//   compressed-tensors has no engine rule: it uses the msmodelslim one; SGLang's NPU path uses
//   npu_quantize likewise.
//
// MoE: the same class serves an expert stack; every expert has its own input_scale/offset.
// runtime_tensors(): dense: weight [N,K], input_scale [1], input_offset [1], deq_scale [N] (fp32
// values), quant_bias [N]; stack: w13_/w2_ prefixed with a leading [E].
#include <memory>

#include "schemes/int/msmodelslim_int.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

struct W8A8StaticRules {
  MsIntRules producer;  // qparams, weight codes, deq_scale, quant_bias
  // vllm-ascend allocates input_scale in params_dtype: the F32 file value is rounded to the
  // model dtype at load and its reciprocal computed in the model dtype. Others keep it as stored
  // and take the reciprocal in act_arith.
  bool input_scale_in_model_dtype = false;
  ScaleUse act_scale_use = ScaleUse::kMultiplyReciprocal;
  Arith act_arith = Arith::kFp32;
  IntRound act_round = IntRound::kHalfEven;
};
W8A8StaticRules w8a8_static_rules(Dialect d);

// Requires request.activations (min/max of the layer input). Weights symmetric per channel
// (request.weights, if given, must say int8 symmetric channel).
TensorMap quantize_w8a8_static(const QuantizeRequest& request);

// The fp32 value of a deq_scale tensor (I64 bit pattern or F32), validated (finite > 0).
std::vector<double> decode_deq_scale(const TensorView& t, const std::string& where);
// fp32 value -> the int64 the saver writes (bits as int32, sign-extended).
int64_t deq_scale_to_i64(double f32_value);

// Effective fp64 weight (q_w · deq_scale / input_scale) from quantize_w8a8_static's tensors.
Matrix dequantize_w8a8_static(const TensorMap& tensors, const std::string& where = "w8a8");

class W8A8StaticLinearMethod final : public LinearMethod {
 public:
  W8A8StaticLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  TensorMap runtime_tensors() const override;
  const W8A8StaticRules& rules() const { return rules_; }
  // For an engine's own kernels: how one expert's input is quantized (the scale as used, the
  // reciprocal factor when the rule multiplies, the offset) and its int32 epilogue terms.
  struct StaticActivation {
    double scale = 1.0, factor = 0.0, offset = 0.0;
    bool divide = false;  // x / scale, else x * factor
    Arith arith = Arith::kFp32;
  };
  StaticActivation static_activation(int64_t expert) const;
  const std::vector<int64_t>& quant_bias(int64_t expert) const {
    return experts_.at(static_cast<size_t>(expert)).quant_bias;
  }
  const std::vector<double>& deq_scale(int64_t expert) const {
    return experts_.at(static_cast<size_t>(expert)).deq_scale;
  }
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;

 private:
  struct Expert {
    QuantizedMatrix weight;  // codes q_w, lattice 1, one unit scale
    double input_scale = 1.0;
    double input_offset = 0.0;
    std::vector<int64_t> quant_bias;
    std::vector<double> deq_scale;
  };
  QuantizedMatrix quantize_codes(const Matrix& x, const Expert& ex) const;
  W8A8StaticRules rules_;
  std::vector<Expert> experts_;
};

std::unique_ptr<LinearMethod> make_w8a8_static_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
