#pragma once
// `w8a8-int8-dyn` on the GPU (schemes/int/w8a8_int8_dynamic.h): int8 weights with one
// fp32 scale per output row (channel strategy, or each fused partition's tensor scale per row,
// SGLang's fp8 requantization already applied by the processed reference method), activations
// quantized per token on the fly in the run's dialect, an exact int8 GEMM and an fp32 epilogue
// (kernels/int8_gemm.h).
//
// `w4a8-dyn` (msModelSlim W4A8_DYNAMIC, schemes/int/w4a8_dynamic.h) runs here too: its
// int4 codes are held one a byte (the same integers, so the exact int32 accumulation is the
// same; twice the packed format's weight bytes, a correctness path, not a bandwidth one), its
// activations quantized by torch_npu's npu_dynamic_quant rule (kernels/int8_gemm.h `npu`) in
// every dialect but ideal. scale_bias is checked by the reference at load and not used: it only
// cancels the NPU kernel's split of the int8 codes.
//
// Dialects: the activation codes follow vllm or sglang bit for bit (the reference's
// Int8ActRules); a run in any other dialect is refused by name.
//
// Static per-tensor inputs (compressed-tensors ct-w8a8-int8[-wtensor]-static[-asym]), vllm
// dialect: vLLM's static_scaled_int8_quant_kernel (symmetric: rn_sat(x / s) in fp32) or its
// azp kernel (asymmetric: sat(rint(x * fp32(1/s)) + z)), every token's scale s; the GEMM runs
// on the raw codes q and takes the zero point out exactly as vLLM's azp_adj does: acc_bias[n] =
// -z * sum_k w[n, k] (int32), added to the exact accumulator before the epilogue. The dump's
// x_values are q - z, as the reference records them. SGLang ignores static input scales and
// quantizes per token: the sglang dialect does the same, here and in the reference.
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/int8_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class W8A8Int8Method final : public GpuLinearMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit W8A8Int8Method(const reference::LinearMethod& host, int64_t expert = -1);
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t workspace_bytes(int64_t max_tokens) const override;
  size_t device_bytes() const override;
  ActivationCodes activation_codes(const void* workspace, int64_t t) const override;

 private:
  ActivationWorkspace ws_;
  Int8ActDialect dialect_ = Int8ActDialect::kVllm;
  DeviceBuffer<int8_t> codes_;
  DeviceBuffer<float> scales_, bias_;
  // Static inputs (vllm): the quantizer's parameters and the zero point's GEMM correction.
  bool static_input_ = false;
  QuantizeInt8StaticParams static_;
  int32_t input_zero_point_ = 0;
  DeviceBuffer<int32_t> zero_point_adjust_;
};

}  // namespace qparity::gpu
