#pragma once
// The weight-only integer family on the GPU: msModelSlim W8A16 (`w8a16-ch`, `w8a16-g<N>`, with
// offsets; schemes/int/w8a16.h) and compressed-tensors pack-quantized INT4 / INT8
// (`w4a16-g32`, symmetric or asymmetric; schemes/int/pack_quantized_int.h). Both are
// w = (q - zero) * scale per group along K with bf16 activations, so one kernel family
// (kernels/weight_only_gemm.h) serves them.
//
// Built from the processed reference method's ProcessedIntWeight (codes in column order, zeros in
// code units, fp64 scales that are the checkpoint's own F32 / BF16 values) and repacked once:
//   codes   int8 as is; int4 two a byte, low nibble first, u = q + 8;
//   scales  bf16 when every scale is exactly a bf16 value (compressed-tensors stores them in the
//           model dtype), else fp32 (msModelSlim's F32 scales), never rounded;
//   zeros   absent when all zero (symmetric); int8 when all are integers in [-128, 127] and the
//           codes are int4; else fp32 (msModelSlim's F32 offsets, kept exactly);
//   bias    fp32, when the layer has a non-zero one.
// The GPU cannot run: actorder=group (a column permutation; refused by the reference accessor),
// bit widths other than 4 and 8, K or group not a multiple of 16 (int8) / 32 (int4). Each is an
// Error naming the layer.
#include <memory>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

class WeightOnlyIntMethod final : public GpuLinearMethod {
 public:
  // expert: -1 a dense layer, e >= 0 expert e of a stack (upload_util.h).
  WeightOnlyIntMethod(const reference::LinearMethod& host, const GpuMethodOptions& options,
                      int64_t expert = -1);
  // Benches only (random_model.h): a layer of arbitrary int4 / int8 codes and one bf16 scale
  // value for every group, symmetric, made on the device: real sizes without a checkpoint.
  struct Random {
    int bits = 4;
    int64_t group = 32;
    float scale = 0.005f;
    uint64_t seed = 1;
  };
  WeightOnlyIntMethod(std::string prefix, SchemeId scheme, int64_t out_features,
                      int64_t in_features, const Random& r);
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t device_bytes() const override;
  int bits() const { return bits_; }
  int64_t group() const { return group_; }
  bool scale_bf16() const { return scale_bf16_; }
  bool faulty() const { return fault_; }
  // The layer's device pointers, for a grouped launch of a stack's experts (grouped_experts.h).
  WeightOnlyExpert device_view() const;

 private:
  int bits_ = 8;
  int64_t group_ = 0;
  bool scale_bf16_ = false, fault_ = false;
  DeviceBuffer<uint8_t> codes_;
  DeviceBuffer<float> scales_f32_, zeros_f32_, bias_;
  DeviceBuffer<__nv_bfloat16> scales_bf16_;
  DeviceBuffer<int8_t> zeros_i8_;
};

}  // namespace qparity::gpu
