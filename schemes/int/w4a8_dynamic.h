#pragma once
// Scheme `w4a8-dyn`: msModelSlim W4A8_DYNAMIC, v1 ("version" "1.0.0", group_size 0) per-channel
// layout: signed INT4 weights, INT8 activations quantized per token at run time, integer GEMM
// (FORMATS.md §5.1, §5.10; the facts below were read from the sources each line names).
//
// Tensors per shard (N = out_features of the shard, K = in_features), JSON type "W4A8_DYNAMIC":
//   weight         I8  [N/2, K]  two int4 codes a byte along N (the OUTPUT dim):
//                                byte[j, k] = (q[2j, k] & 0xF) | (q[2j+1, k] << 4), two's
//                                complement, even channel in the low nibble (Ascend/msmodelslim
//                                `core/quant_service/modelslim_v1/save/utils/pack.py`
//                                `w4a8_pack_int4` + `_pack_int4`; vllm-ascend
//                                `quantization/methods/w4a8/w4a8.py` `_pack_int4_to_int8`,
//                                "mirroring the modelslim path"). N must be even.
//   weight_scale   F32 [N, 1]    s[n] (older spellings [N] accepted)
//   weight_offset  F32 [N, 1]    all zeros (msmodelslim `ascendv1.py` `on_w4a8_dynamic` writes
//                                zeros_like(weight_scale)); a nonzero offset is an Error
//   scale_bias     F32 [N, 1]    gate/up/q/k/v_proj: 8 * sum_k q[n, k] * s[n]
//                      [N, 16]   down_proj / o_proj: column c = 8 * sum over k in
//                                [c K/16, (c+1) K/16) of q[n, k] * s[n]; needs K % 16 == 0
//                                (msmodelslim `save/utils/pack.py` `process_scale(name, bias,
//                                tp_num=16)`, called by `ascendv1.py` `on_w4a8_dynamic` with the
//                                fp32 q * s; the linear's NAME picks the shape)
//   bias           F32 [N]       optional, type FLOAT
// Refused by name: the per-group two-level layout (weight_scale_second / weight_offset_second,
// group_size > 0; msmodelslim v0 `get_param_from_quantizer`, current vllm-ascend raises "Per-Group
// quantization, which is no longer supported") and the pre-1.0.0 unpacked layout (weight I8
// [N, K], one int4 a byte; older vllm-ascend `w4a8_dynamic.py`).
//
// Formula (the reference computes it exactly; `exact` and `emulate` modes alike):
//   weight quantize  s[n] = max(amax_n / 7, FLT_EPSILON) (fp32), q = clamp(RNE(w / s), -8, 7)
//                    (msmodelslim `calculate_int_qparam` symmetric, max_bound 2^(4-1) - 1 = 7,
//                    and `int_quantize`: (x/scale + offset).round_() = torch.round, half to even,
//                    clamp to [-8, 7]; `WeightPerChannelMinmax`). Arithmetic: ms_int_rules()
//                    (msmodelslim_int.h): fp32 in the msmodelslim dialect; ideal computes s in
//                    fp64, stores it as fp32 and takes the codes from the stored scale. Since
//                    |w / s| <= 7, -8 is reached only by a scale not from this min-max rule.
//   activation       per token, symmetric int8 (torch_npu `npu_dynamic_quant`; CANN DynamicQuant
//                    kernel `src/quant/dynamic_quant/op_kernel/dynamic_quant.h`
//                    `DynamicQuant::Compute`, mirror Hayden727/cann-ops): x in fp32, amax =
//                    max_k |x|, m = fp32(127 / amax), stored scale a_s = fp32(1 / m) (NOT amax/127
//                    computed directly), codes RINT(fp32(x * m)) (CAST_RINT: half to even), in
//                    [-127, 127] (no clamp needed). Every dialect but ideal uses this NPU rule:
//                    all runtimes of the format (vllm-ascend, SGLang's NPU backend) call that op.
//                    ideal: a_s = amax / 127 and codes RNE(x * 127 / amax) in fp64.
//                    All-zero token (the op itself divides by 0 there): codes 0 and a_s = 0, by
//                    definition here, in every dialect - the output row is 0 either way.
//   output           y[t, n] = a_s[t] * s[n] * sum_k x_q[t, k] * q[n, k] + bias[n]: the sum an
//                    exact integer (scaled_gemm with the int32 accumulator check), the scales
//                    applied in fp64. The Ascend A8W4 grouped-matmul kernel splits each int8 code
//                    x = 16 x_hi + x_lo + 8 with x_hi, x_lo in [-8, 7] and adds scale_bias to
//                    cancel the +8 (hicann/ops-transformer `gmm/grouped_matmul/op_kernel/
//                    grouped_matmul_antiquant_a8w4_msd_pre.h` `GMMA8W4PreProcess::Process` and
//                    `grouped_matmul_antiquant_a8w4_msd.h` `ComputeDequantAndActivate`:
//                    out = a_s * (16 A_hi + A_lo + bias[n])); with bias = 8 * s * sum_k q that is
//                    exactly the formula above. Not emulated: the kernel's fp16 workspace for the
//                    per-half dequantized sums, its fp32 combination, and the fp32 rounding of
//                    the stored scale_bias (bounded by the load check below).
// Load check: because the NPU adds the STORED scale_bias, each stored value must equal
// 8 * sum_k q[n, k] * s[n] over its chunk (computed exactly from the stored codes and scale) to
// within 1e-6 relative plus the fp32 rounding the producer may have made: the q * s products and
// their sum in fp32 in any order, |error| <= (Kc + 1) * 2^-24 * 8 * s[n] * sum_k |q[n, k]| (Kc:
// the chunk's length). A value outside that is an Error naming the tensor, row and column.
//
// MoE: the per-expert tensors (`<stack>.<e>.{gate,up,down}_proj.*`) load into the expert stack's
// method like any other scheme's; vllm-ascend fuses them as w13_* (gate, then up) and w2_*
// (`AscendW4A8DynamicFusedMoEMethod`), whose w13 scale_bias [E, 2I, 1] and w2 [E, H, 16] it sums
// over the last dim. Current vllm-ascend registers W4A8_DYNAMIC for MoE layers only (dense layers
// of such checkpoints are W8A8_DYNAMIC, per MindIE-LLM's W4A8 doc); the reference runs it on
// dense linears too, with the same math.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

// Columns of scale_bias msModelSlim's process_scale gives a linear by its name (the last dotted
// component of the module name): 1 for gate_proj / up_proj / q_proj / k_proj / v_proj, 16 for
// down_proj / o_proj, 0 for any other name (the tool then writes the unsummed [N, K]; refused).
int64_t w4a8_scale_bias_columns(std::string_view linear_name);

// One weight code: clamp(RNE(w / s), -8, 7) with w / s in the dialect's arithmetic.
int64_t w4a8_weight_code(double w, double scale, Dialect d);
// The stored (fp32) per-channel scale of a row with absolute maximum amax.
double w4a8_weight_scale(double amax, Dialect d);

// Per-token int8 codes [T, K] with their scales [T, 1] (see the header comment).
QuantizedMatrix quantize_w4a8_input(const Matrix& x, Dialect d);

// scale_bias of int4 codes q [n, k] with per-row scales s [n]: 8 * sum_k q * s per row
// (columns == 1) or per K/16 chunk (columns == 16), exact in fp64, [n * columns] row-major.
std::vector<double> w4a8_scale_bias(std::span<const int64_t> q, std::span<const double> s,
                                    int64_t n, int64_t k, int64_t columns);

// msModelSlim's W4A8_DYNAMIC tensors of request.weight: weight (packed), weight_scale,
// weight_offset (zeros), scale_bias (the exact value rounded once to fp32; its shape from
// request.where's last name component), bias. request.where must name the linear.
TensorMap quantize_w4a8_dynamic(const QuantizeRequest& request);

class W4A8DynamicLinearMethod final : public LinearMethod {
 public:
  W4A8DynamicLinearMethod(LinearShape shape, MethodConfig config);
  std::vector<ParamSpec> create_weights(int64_t partition) const override;
  // The int4 codes (one a byte, sign-extended: the same integers an int8 GEMM multiplies), the
  // per-row scales, zero offsets and the bias: what the GPU's int8 GEMM runs (gpu_engine/quant/
  // w8a8_int8.h). scale_bias is not part of it: it only cancels the NPU's split of the codes.
  std::optional<ProcessedIntWeight> processed_int_weight(int64_t expert) const override;

 protected:
  void process() override;
  Matrix do_apply(const Matrix& x, int64_t expert) const override;
  Matrix do_dequantized_weight(int64_t expert) const override;
  std::optional<QuantizedMatrix> do_quantize_input(const Matrix& x, int64_t expert) const override;

 private:
  int64_t bias_columns(int64_t partition) const;
  std::vector<QuantizedMatrix> weights_;  // per expert, fused [N, K] int4 codes, scales [N, 1]
  std::vector<std::vector<double>> biases_;
};

std::unique_ptr<LinearMethod> make_w4a8_dynamic_method(LinearShape shape, MethodConfig config);

}  // namespace qparity::reference
