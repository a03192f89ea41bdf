#pragma once
// msModelSlim `w8a8-static` and `w8a8s` on the GPU (schemes/int/w8a8_static.h): int8
// weights, the input quantized with the file's static per-tensor scale and offset exactly as the
// dialect computes it (vllm: vllm-ascend's reciprocal of the model-dtype scale; sglang: the NPU's
// fp32 reciprocal), the raw codes fed to an exact int8 GEMM, quant_bias added to the int32
// accumulator, deq_scale the fp32 epilogue (kernels/int8_gemm.h). The layer's `bias` is already
// folded into quant_bias (the reference's contract).
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/int8_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class W8A8StaticMethod final : public GpuLinearMethod {
 public:
  explicit W8A8StaticMethod(const reference::LinearMethod& host);  // dense layers only
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t workspace_bytes(int64_t max_tokens) const override;
  size_t device_bytes() const override;
  ActivationCodes activation_codes(const void* workspace, int64_t t) const override;

 private:
  ActivationWorkspace ws_;
  QuantizeInt8StaticParams quant_;  // the rule; pointers filled per call
  DeviceBuffer<int8_t> codes_;
  DeviceBuffer<float> deq_scale_;
  DeviceBuffer<int32_t> quant_bias_;
};

}  // namespace qparity::gpu
