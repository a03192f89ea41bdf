#pragma once
// FP8 weights with bf16 inputs on the GPU: compressed-tensors' FP8 weight-only points
// (`fp8-tensor-a16`, `fp8-channel-a16`, `fp8-block-a16`: vLLM's CompressedTensorsW8A16Fp8) and
// `mxfp8a16` (MXFP8A16: e4m3 elements, an E8M0 scale per 32 columns). The weight-only GEMM
// (kernels/weight_only_gemm.h, fp8_codes) streams the e4m3fn bytes and multiplies each by its
// scale in fp32 (exact: 4 significant bits times a bf16 / fp32 / power-of-two scale), then sums
// the bf16 inputs' products in fp32: the reference's y = x w^T in fp64 up to fp32's accumulation.
//
// Layout, from the processed reference method (fused partitions already unified as the dialect
// does it):
//   codes   [n, k] e4m3fn bytes (the processed codes on the 2^-9 lattice, each an e4m3fn value)
//   scales  [n, k / g] with g = gcd(k, the scale block's columns): the scale grid (per tensor,
//           per row, 128 x 128 blocks ragged at the edges, 1 x 32 MX blocks) repeated onto
//           every row and every g columns, exactly; bf16 when every scale is a bf16 value, else
//           fp32 (the stored F32 scales, never rounded)
//   bias    fp32 when non-zero.
// vLLM runs these points on Marlin, which rounds each dequantized weight to bf16 before its
// bf16 MMA; neither the reference nor this method models that rounding (docs/LIMITS.md).
// A dense layer runs on the tensor cores instead (kernels/weight_only_mma.h, the codes repacked
// into its tiles): each e4m3 value times a bf16 input exactly in fp32, the tensor core's fp32
// sum of each 16-column step, times the step's scale, accumulated in fp32. Expert layers keep the
// row-major layout of the grouped launch.
// Constraints: k a multiple of 16 (an Error naming the layer).
#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "gpu_engine/quant/weight_only_mma_layout.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class Fp8WeightOnlyMethod final : public GpuLinearMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  explicit Fp8WeightOnlyMethod(const reference::LinearMethod& host, int64_t expert = -1);
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t device_bytes() const override;

 private:
  int64_t group_ = 0;
  bool scale_bf16_ = false;
  DeviceBuffer<uint8_t> codes_;
  DeviceBuffer<float> scales_f32_, bias_;
  DeviceBuffer<__nv_bfloat16> scales_bf16_;
  MmaWeightOnDevice mma_;  // a dense layer's tiles (then codes_ and the scales are empty)
};

}  // namespace qparity::gpu
