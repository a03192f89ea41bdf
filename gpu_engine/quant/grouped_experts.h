#pragma once
// A MoE stack's quantized experts (one GpuLinearMethod each) as one grouped launch: the decode
// path of quantized experts (decoder_moe.cpp). The rows come grouped by expert on the device, so
// no expert id travels to the host and the decode step stays inside a CUDA graph; one launch (two
// with activation quantization) serves every active expert instead of one or two per expert.
//
// Which stacks: weight-only integer experts (`w8a16-*`, `w4a16-g32`, `mxint4`) and fp8-coded
// experts whose activation rule is row-local (`fp8-channel`, `fp8-block`, `mxfp8`, and
// `fp8-tensor` with a static input scale shared by the experts): the activations are quantized
// for all rows at once, which is each row's own quantization, as per expert. Every expert of the
// stack must have the same kernel configuration (bits, group, scale and zero kinds; block
// geometry, rule, alpha). Anything else (int8 w8a8 experts, packed 4-bit nvfp4 / mxfp4 weights,
// dynamic per-tensor activation scales) stays on the per-expert host path; make() says why.
//
// Numerics: each row's sums are the per-expert launch's, bit for bit (the kernels are
// batch-invariant and read the same bytes), so the engine's results do not depend on the path.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/expert_groups.h"
#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/kernels/weight_only_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"

namespace qparity::gpu {

class GroupedExperts {
 public:
  // The stack's grouped form, or nullptr with the reason in `why` when it has none.
  static std::unique_ptr<GroupedExperts> make(
      const std::vector<std::unique_ptr<GpuLinearMethod>>& experts, std::string* why);

  // y [rows, n] from x [rows, k], the rows grouped by expert as `groups` says, at most
  // `max_rows_per_expert` of them for any one expert. `workspace`: workspace_bytes(rows).
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t rows, int64_t max_rows_per_expert,
             const ExpertGroups& groups, cudaStream_t stream, void* workspace) const;
  size_t workspace_bytes(int64_t rows) const { return fp8_ ? ws_.bytes(rows) : 0; }

 private:
  GroupedExperts() = default;
  bool fp8_ = false;
  int64_t n_ = 0, k_ = 0;
  WeightOnlyGemmParams int_;  // the launch's configuration (grouped fields set per call)
  DeviceBuffer<WeightOnlyExpert> int_table_;
  QuantizeFp8Params quant_;
  ActivationWorkspace ws_;
  Fp8GemmParams fp8_gemm_;
  DeviceBuffer<Fp8Expert> fp8_table_;
};

}  // namespace qparity::gpu
