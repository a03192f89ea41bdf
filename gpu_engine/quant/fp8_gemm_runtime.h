#pragma once
// What the fp8 GPU methods (fp8_linear.h) and the MX ones (mx_linear.h) run once their weight is
// laid out: e4m3fn weight bytes with an fp32 scale grid, activations quantized on the fly by a
// QuantizeFp8Params rule into the engine's workspace, and the fp8 scaled GEMM
// (kernels/fp8_gemm.h). The methods differ in how they read the reference's processed weight
// and rule, not in what runs.
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "reference_cpu/quant/scaled_gemm.h"

namespace qparity::gpu {

struct Fp8GemmRuntime {
  ActivationWorkspace ws;   // extra: the per-tensor amax
  QuantizeFp8Params quant;  // the rule; pointers filled per call
  int64_t b_block_rows = 1, b_block_cols = 0;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales, bias;

  // A processed weight [n, k]: its element values as e4m3fn bytes (each must be one: e4m3fn
  // codes, or e2m1 values, which are e4m3fn values), its scale grid and bias as fp32 (exact), the
  // workspace geometry for the rule in `quant`. Errors name `where`.
  void upload(const reference::QuantizedMatrix& w, const std::vector<double>& bias_values,
              int64_t n, int64_t k, const std::string& where);
  void apply(const std::string& name, const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
             int64_t n, int64_t k, cudaStream_t stream, void* workspace) const;
  GpuLinearMethod::ActivationCodes activation_codes(const void* workspace, int64_t t) const;
  size_t device_bytes() const { return codes.bytes() + scales.bytes() + bias.bytes(); }
};

}  // namespace qparity::gpu
