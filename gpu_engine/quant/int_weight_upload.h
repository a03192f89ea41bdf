#pragma once
// A processed integer weight (reference::ProcessedIntWeight) in the GPU's integer-weight layout,
// what the weight-only GEMM (kernels/weight_only_gemm.h) and the group-scaled integer GEMM
// (kernels/int_group_gemm.h) read:
//   codes   int8 as is; int4 two a byte, low nibble first, u = q + 8;
//   scales  bf16 when every scale is exactly a bf16 value (compressed-tensors stores them in the
//           model dtype), else fp32 (msModelSlim's F32 scales), never rounded;
//   zeros   absent when all zero (symmetric); int8 when all are integers in [-128, 127] and the
//           codes are int4 (or `int8_zeros_only`); else fp32 (msModelSlim's F32 offsets, exact);
//   bias    fp32, when the layer has a non-zero one;
//   perm    int32 [k], act order only: the input column of each stored column.
// Errors name `where`: bit widths other than 4 and 8, a shape other than [n, k], K or group not a
// multiple of the kernels' 16 (int8) / 32 (int4) codes a load, a code outside its range, a scale
// that is not finite and > 0, a zero or bias that is not an fp32 value.
#include <cuda_bf16.h>

#include <string>

#include "gpu_engine/device_buffer.h"
#include "schemes/method/linear_method.h"

namespace qparity::gpu {

struct IntWeightOnDevice {
  int bits = 8;
  int64_t group = 0;
  bool scale_bf16 = false;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales_f32, zeros_f32, bias;
  DeviceBuffer<__nv_bfloat16> scales_bf16;
  DeviceBuffer<int8_t> zeros_i8;
  DeviceBuffer<int32_t> perm;

  const void* scales() const {
    return scale_bf16 ? static_cast<const void*>(scales_bf16.get())
                      : static_cast<const void*>(scales_f32.get());
  }
  size_t bytes() const {
    return codes.bytes() + scales_f32.bytes() + scales_bf16.bytes() + zeros_f32.bytes() +
           zeros_i8.bytes() + bias.bytes() + perm.bytes();
  }
};

// int8_zeros_only: zero points must be int8 integers (the integer GEMM's), an Error otherwise.
IntWeightOnDevice upload_int_weight(const reference::ProcessedIntWeight& w, int64_t n, int64_t k,
                                    const std::string& where, bool int8_zeros_only = false);

}  // namespace qparity::gpu
