#pragma once
// The GPU side of the LinearMethod lifecycle (ARCHITECTURE.md, schemes/method/
// linear_method.h). Steps 1-3 are shared with the reference literally: the same QuantPlan entry
// makes the same reference::LinearMethod, which registers the checkpoint's tensors
// (create_weights), takes them from the loader with every name, dtype and shape checked (load),
// and converts them to the scheme's run-time form once (process_weights_after_loading: U8 shift,
// offset and zero-point conventions, partition fusion, scale checks). The GPU method then takes
// that processed form and builds its kernels' layout on the device (repacking codes, narrowing
// scales where exact), and the host copy is dropped. Step 4, apply(), runs on the device.
//
// A scheme the GPU has no method for is an Error naming the layer and the scheme: no quantized
// layer ever runs as bf16.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "schemes/description/scheme_registry.h"

namespace qparity::reference {
class LinearMethod;
}

namespace qparity::gpu {

class GpuLinearMethod {
 public:
  GpuLinearMethod(std::string prefix, SchemeId scheme, int64_t out_features, int64_t in_features)
      : prefix_(std::move(prefix)), scheme_(std::move(scheme)), n_(out_features), k_(in_features) {}
  virtual ~GpuLinearMethod() = default;
  GpuLinearMethod(const GpuLinearMethod&) = delete;
  GpuLinearMethod& operator=(const GpuLinearMethod&) = delete;

  const std::string& prefix() const { return prefix_; }
  const SchemeId& scheme() const { return scheme_; }
  int64_t out_features() const { return n_; }
  int64_t in_features() const { return k_; }

  // y [t, n] = the layer applied to x [t, k], bf16 row-major device buffers, on `stream`.
  // `workspace`: at least workspace_bytes(t) device bytes, 256-byte aligned, that the engine
  // lends every method (activation codes live there until the next apply).
  virtual void apply(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t t, cudaStream_t stream,
                     void* workspace) const = 0;
  virtual size_t workspace_bytes(int64_t max_tokens) const {
    (void)max_tokens;
    return 0;
  }
  // Device bytes of the layer's run-time tensors.
  virtual size_t device_bytes() const = 0;

  // The activation codes the last apply() fed its GEMM (activation-quantized schemes): device
  // pointers into `workspace`, [t, k] codes and [t, scale_cols] fp32 scales, for the dumps'
  // <layer>.x_values / .x_scales points. Weight-only schemes: values == nullptr.
  struct ActivationCodes {
    enum class Kind : uint8_t { kInt8, kFp8E4m3 } kind = Kind::kInt8;
    const void* values = nullptr;
    const float* scales = nullptr;
    int64_t scale_cols = 1;
    int32_t zero_point = 0;  // int8 codes: the dump records values - zero_point (q - z)
  };
  virtual ActivationCodes activation_codes(const void* workspace, int64_t t) const {
    (void)workspace, (void)t;
    return {};
  }

 private:
  std::string prefix_;
  SchemeId scheme_;
  int64_t n_, k_;
};

// Whether the GPU has a method for `scheme` on a dense (non-expert) linear; when not, `why` says
// what is missing.
bool gpu_supports_linear_scheme(const SchemeId& scheme, std::string* why);
// Whether it has one for the experts of a MoE stack (each expert its own method).
bool gpu_supports_expert_scheme(const SchemeId& scheme, std::string* why);

struct GpuMethodOptions {
  // Test-only fault injection (weight_only_gemm.h): the deliberate bug bisect must find.
  bool fault_group_off_by_one = false;
  // Opt-in: dense fp8 W8A8 layers (fp8-tensor, fp8-channel, fp8-block) on Hopper's fp8 tensor
  // cores through cuBLASLt (kernels/fp8_blas.h) instead of the fp32-exact CUDA-core GEMM. ~100x
  // faster past one token, but its accumulation is not fp32's: the fp8 engine policies, derived
  // for fp32 accumulation, fail its layer-local rows (measured, ENGINE.md), so it is off until
  // they have a measured Hopper (sm90) section.
  bool fp8_tensor_cores = false;
};

// Step 3 on the device: the GPU method of a processed reference method (expert -1: a dense
// layer; e >= 0: expert e of a stack). Throws naming the layer (host.shape().prefix) and the
// scheme when the GPU cannot run it.
std::unique_ptr<GpuLinearMethod> make_gpu_linear_method(const reference::LinearMethod& host,
                                                        const GpuMethodOptions& options = {},
                                                        int64_t expert = -1);

}  // namespace qparity::gpu
