#pragma once
// A weight-only layer's codes, scales and zeros in the tensor-core tile layout that
// kernels/weight_only_mma.h reads, made on the host once at load from the row-major processed
// weight. And the rule of which layers that kernel can run: the others keep the row-major layout
// and the CUDA-core kernel (kernels/weight_only_gemm.h).
#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/weight_only_mma.h"

namespace qparity::gpu {

struct MmaPackedWeight {
  MmaCodes codes = MmaCodes::kInt4;
  int64_t n = 0, k = 0, group = 0;
  std::vector<uint8_t> code_bytes;         // weight_only_mma_code_bytes(codes, n, k)
  bool scale_bf16 = false;                 // the scales are bf16 values, held in scales_bf16
  std::vector<float> scales_f32;           // weight_only_mma_scale_count(n, k, group), or empty
  std::vector<__nv_bfloat16> scales_bf16;  // the same count, or empty
  std::vector<int8_t> zeros;               // the same count, or empty (every zero 0)
};

// Why the tensor-core kernel cannot run a weight of these codes (empty when it can): k or group not
// a multiple of 16, group not dividing k, a zero that is not an integer in the kernel's range
// ([-8, 7] for int4, [-128, 127] for int8; none for e4m3).
std::string weight_only_mma_refusal(MmaCodes codes, int64_t k, int64_t group,
                                    const std::vector<double>& zeros);

// codes [n * k] row-major: int4 / int8 the signed codes q, e4m3 the code bytes; scales and zeros
// [n * (k / group)] row-major (zeros empty when all are 0), every scale finite and exact in fp32
// (in bf16 too when scale_bf16). An Error naming `where` when the weight breaks a rule above, a
// code is outside its range, or a size is wrong.
MmaPackedWeight pack_weight_only_mma(MmaCodes codes, int64_t n, int64_t k, int64_t group,
                                     const std::vector<int8_t>& q,
                                     const std::vector<double>& scales,
                                     const std::vector<double>& zeros, bool scale_bf16,
                                     const std::string& where);

// The packed weight on the device, and the kernel's parameters for one apply.
struct MmaWeightOnDevice {
  MmaCodes codes = MmaCodes::kInt4;
  int64_t n = 0, k = 0, group = 0;
  bool scale_bf16 = false;
  DeviceBuffer<uint8_t> code_bytes;
  DeviceBuffer<float> scales_f32;
  DeviceBuffer<__nv_bfloat16> scales_bf16;
  DeviceBuffer<int8_t> zeros;

  bool on() const { return code_bytes.size() > 0; }
  size_t bytes() const {
    return code_bytes.bytes() + scales_f32.bytes() + scales_bf16.bytes() + zeros.bytes();
  }
  WeightOnlyMmaParams params(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t m,
                             const float* bias) const;
};
MmaWeightOnDevice upload_mma_weight(const MmaPackedWeight& p);

}  // namespace qparity::gpu
