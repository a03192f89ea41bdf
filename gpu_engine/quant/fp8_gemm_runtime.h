#pragma once
// What the fp8 GPU methods (fp8_linear.h) and the MX ones (mx_linear.h) run once their weight is
// laid out: e4m3fn weight bytes with an fp32 scale grid, activations quantized on the fly by a
// QuantizeFp8Params rule into the engine's workspace, and the fp8 scaled GEMM
// (kernels/fp8_gemm.h); or, for e2m1 weights (`packed`), the weight packed two codes a byte with a
// scale byte per block and the packed fp4 GEMM (kernels/fp4_gemm.h) over doubled activation codes.
// The methods differ in how they read the reference's processed weight and rule, not in what runs.
// e4m3 weights whose scales cuBLASLt's fp8 scaling modes express (fp8_blas.h: per-token or
// per-tensor activation scales with per-row weight scales; 1 x 128 activation groups with
// 128 x 128 weight blocks) run on the fp8 tensor cores, the token count padded to a multiple of 4
// (zero codes and scales) with the product through the workspace: block scales at every batch
// size, per-row scales from 2 tokens on (one token reads the weight faster on the CUDA-core GEMM
// there; measured, ENGINE.md). Everything else, and a shape cuBLASLt has no algorithm for, runs
// the CUDA-core GEMM (fp8_gemm.h).
#include <optional>
#include <string>
#include <vector>

#include "gpu_engine/device_buffer.h"
#include "gpu_engine/kernels/fp4_gemm.h"
#include "gpu_engine/kernels/fp8_blas.h"
#include "gpu_engine/kernels/fp8_gemm.h"
#include "gpu_engine/quant/activation_workspace.h"
#include "gpu_engine/quant/gpu_linear_method.h"
#include "schemes/fp8/fp8_common.h"
#include "schemes/math/scaled_gemm.h"

namespace qparity::gpu {

// The quantizer fields (reciprocal use, amax floor, minimum scale, zero saturation) of the
// reference's fp8 activation rule, which must use fp32 arithmetic, no UE8M0 rounding and no
// zero-scale replacement; an Error naming `where` and `dialect` otherwise.
void set_fp8_activation_rule(const reference::Fp8ScaleRule& rule, const std::string& dialect,
                             const std::string& where, QuantizeFp8Params* q);

// The e4m3fn bytes of a processed weight's values (codes on its lattice), row-major [rows, cols];
// an Error naming `where` and the first element that is not an e4m3fn value.
std::vector<uint8_t> e4m3_bytes(const reference::QuantizedMatrix& w, const std::string& where);

struct Fp8GemmRuntime {
  ActivationWorkspace ws;   // extra: the per-tensor amax
  QuantizeFp8Params quant;  // the rule; pointers filled per call
  int64_t b_block_rows = 1, b_block_cols = 0;
  float alpha = 1.f;  // the GEMM's factor on each sum (NVFP4's 1/(gs_in gs_w))
  // e2m1 weights packed (set before upload): `codes` holds [n, k/2] nibbles and `scale_bytes`
  // the blocks' e4m3 (16 columns) or E8M0 (32 columns) bytes; `scales` stays empty.
  bool packed = false;
  // With `packed`: bf16 activations straight into the GEMM (NVFP4A16, MXFP4A16): no quantizer,
  // no workspace, no activation codes.
  bool weight_only = false;
  Fp4BlockScale packed_scale = Fp4BlockScale::kE4m3Group16;
  DeviceBuffer<uint8_t> scale_bytes;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales, bias;
  // cuBLASLt's operands (fp8_blas.h) when its scaling modes express this layer's scales: the
  // weight scales in the mode's layout, the bias as bf16 (only when each value is one).
  bool tensor_cores = false;  // whether to look for a mode at all (GpuMethodOptions)
  std::optional<Fp8BlasScales> blas;
  DeviceBuffer<float> blas_scales;
  DeviceBuffer<__nv_bfloat16> blas_bias;
  // Per-row scales also as cuBLASLt's outer vectors ([n]): from kOuterVectorFrom tokens that
  // mode is the faster one (bench_quant_linears, H200: per-128-column 1.47-1.94x cuBLASLt bf16 at
  // M <= 64 but 0.90-1.36x from M = 256, where outer vectors give 1.25-1.87x).
  static constexpr int64_t kOuterVectorFrom = 256;
  DeviceBuffer<float> blas_outer_scales;
  // The scaling mode a batch of `rows` (padded) tokens runs in.
  Fp8BlasScales blas_mode(int64_t rows) const {
    return *blas == Fp8BlasScales::kRow128 && rows >= kOuterVectorFrom ? Fp8BlasScales::kOuterVector
                                                                       : *blas;
  }

  // A processed weight [n, k]: its element values as e4m3fn bytes (each must be one: e4m3fn
  // codes, or e2m1 values, which are e4m3fn values), its scale grid and bias as fp32 (exact), the
  // workspace geometry for the rule in `quant`. Errors name `where`.
  void upload(const reference::QuantizedMatrix& w, const std::vector<double>& bias_values,
              int64_t n, int64_t k, const std::string& where);
  void apply(const std::string& name, const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t,
             int64_t n, int64_t k, cudaStream_t stream, void* workspace) const;
  GpuLinearMethod::ActivationCodes activation_codes(const void* workspace, int64_t t) const;
  // Whether a batch of t tokens runs on cuBLASLt, and the token rows its workspace holds.
  bool runs_blas(int64_t t) const {
    return blas && t >= (*blas == Fp8BlasScales::kBlock128 ? 1 : 2);
  }
  int64_t workspace_rows(int64_t t) const { return runs_blas(t) ? (t + 3) / 4 * 4 : t; }
  // The e4m3 bytes, block geometry and scale grid (returned, host fp32) of an unpacked weight.
  std::vector<float> upload_bytes(const reference::QuantizedMatrix& w, const std::string& where);
  void upload_packed(const reference::QuantizedMatrix& w, int64_t n, int64_t k,
                     const std::string& where);
  // After the codes, scales and quantizer rule are set: cuBLASLt's operands from the weight's
  // scale grid ([ceil(n / b_block_rows), ceil(k / b_block_cols)], host fp32) and bias (empty or
  // [n]), when a mode fits; `blas` stays empty otherwise. Sets the workspace geometry too.
  void prepare_blas(const std::vector<float>& grid, const std::vector<float>& bias_values,
                    int64_t n, int64_t k);
  // Whether the weight's block scales are those of 128 x 128 blocks aligned to row 0.
  bool rows_share_blocks(const std::vector<float>& grid, int64_t n, int64_t cols) const;
  size_t device_bytes() const {
    return codes.bytes() + scales.bytes() + scale_bytes.bytes() + bias.bytes() +
           blas_scales.bytes() + blas_bias.bytes() + blas_outer_scales.bytes();
  }
};

// The GPU methods that run on an Fp8GemmRuntime (fp8_linear, mx_linear, nvfp4_linear): they
// differ only in how their constructors read the reference's processed weight and rule into rt_.
class Fp8RuntimeMethod : public GpuLinearMethod {
 public:
  using GpuLinearMethod::GpuLinearMethod;
  void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
             void* workspace) const override;
  size_t workspace_bytes(int64_t max_tokens) const override;
  size_t device_bytes() const override { return rt_.device_bytes(); }
  ActivationCodes activation_codes(const void* workspace, int64_t t) const override;
  // What runs, for a grouped launch of a stack's experts (grouped_experts.h).
  const Fp8GemmRuntime& runtime() const { return rt_; }

 protected:
  Fp8GemmRuntime rt_;
};

}  // namespace qparity::gpu
