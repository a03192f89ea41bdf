#pragma once
// compressed-tensors' WnA8 / WnAFP8 points on the GPU (`ct-w<b>a8-...`, `ct-w<b>afp8-...`: its
// W4A8 and W4AFP8 presets; schemes/int/pack_quantized_int.h): int4 / int8 weights with a scale
// per K-group (or per row), symmetric or with int8 zero points, in act order or not, and 8-bit
// per-token inputs quantized on the fly:
//   int8 inputs   w8a8-int8-dyn's per-token rule of the dialect (vllm or sglang, bit for bit:
//                 kernels/int8_gemm.h launch_quantize_int8_per_token);
//   fp8 inputs    fp8-channel's dynamic per-token rule of the dialect (vllm or sglang, fp32:
//                 kernels/fp8_gemm.h launch_quantize_fp8);
// then the group-scaled integer GEMM (kernels/int_group_gemm.h). With act order the inputs are
// gathered into the codes' column order first (column_gather.h), and quantized there, as the
// reference quantizes them (a per-token scale does not depend on the order); the dumps' x_values
// are in that order, as the reference records them.
// Workspace (activation_workspace.h): codes [t, k], scales [t], then the gathered bf16 inputs.
// Refused by name: other dialects (ideal's fp64 scales, ...), bit widths other than 4 and 8,
// zero points outside int8, K or group not a multiple of 32 (int4) / 16 (int8).
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/kernels/int8_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_engine/quant/int_weight_upload.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class PackedIntA8Method final : public GpuLinearMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit PackedIntA8Method(const reference::LinearMethod& host, int64_t expert = -1);
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t workspace_bytes(int64_t max_tokens) const override;
  size_t device_bytes() const override;
  ActivationCodes activation_codes(const void* workspace, int64_t t) const override;

 private:
  ActivationWorkspace ws_;
  bool fp8_inputs_ = false;
  Int8ActDialect int8_rule_ = Int8ActDialect::kVllm;
  QuantizeFp8Params fp8_rule_;
  IntWeightOnDevice dev_;
};

}  // namespace qparity::gpu
