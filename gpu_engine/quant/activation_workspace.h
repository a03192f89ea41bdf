#pragma once
// The workspace layout every activation-quantized GPU method uses inside the engine's shared
// workspace, for t tokens of k inputs and n outputs, each part 256-byte aligned:
//   codes    [t, k]            one byte a code (int8 or e4m3fn)
//   scales   [t, scale_cols]   fp32, the codes' scales (what the GEMM multiplies)
//   reported [t, scale_cols]   fp32, only with `reported_scales`: the scales the codes stand for
//                              when the GEMM applies a factor of its own (NVFP4's s / gs_in); the
//                              dumps' x_scales hold these, else `scales`
//   doubled  [t, k]            int8, only with `doubled_codes`: e2m1 codes as twice their values,
//                              what the packed fp4 GEMM reads (kernels/fp4_gemm.h)
//   extra    `extra_bytes`     fp32 scratch of the quantizer (fp8's per-tensor amax)
//   by group [group_major_cols, t]  fp32, only when group_major_cols > 0: `scales` again per
//                              128-column group (a per-token scale repeated), token-contiguous
//                              (cuBLASLt's block-scaled fp8 layout, fp8_blas.h)
//   output   bf16 [t, n]       only with `padded_output`: the product of a token count padded
//                              to cuBLASLt's multiple of 4 (fp8_blas.h), before its t rows move
//                              to the layer's output
//   product  int32 [t, n]      prefill-sized int8 batches' cuBLASLt product (int8_gemm.h)
#include <cstddef>
#include <cstdint>

#include "gpu_engine/kernels/int8_gemm.h"

namespace qparity::gpu {

struct ActivationWorkspace {
  int64_t k = 0, n = 0, scale_cols = 1;
  size_t extra_bytes = 0;
  bool int8_product = false;
  bool reported_scales = false;
  bool doubled_codes = false;
  int64_t group_major_cols = 0;
  bool padded_output = false;

  static size_t align(size_t v) { return (v + 255) / 256 * 256; }
  size_t scales_offset(int64_t t) const { return align(static_cast<size_t>(t * k)); }
  size_t scale_grid_bytes(int64_t t) const {
    return align(static_cast<size_t>(t * scale_cols) * sizeof(float));
  }
  size_t reported_offset(int64_t t) const { return scales_offset(t) + scale_grid_bytes(t); }
  size_t doubled_offset(int64_t t) const {
    return reported_offset(t) + (reported_scales ? scale_grid_bytes(t) : 0);
  }
  size_t extra_offset(int64_t t) const {
    return doubled_offset(t) + (doubled_codes ? align(static_cast<size_t>(t * k)) : 0);
  }
  size_t group_major_offset(int64_t t) const { return extra_offset(t) + align(extra_bytes); }
  size_t output_offset(int64_t t) const {
    return group_major_offset(t) + align(static_cast<size_t>(t * group_major_cols) * sizeof(float));
  }
  size_t product_offset(int64_t t) const {
    return output_offset(t) + (padded_output ? align(static_cast<size_t>(t * n) * 2) : 0);
  }
  size_t bytes(int64_t max_tokens) const {
    return product_offset(max_tokens) + (int8_product ? int8_gemm_scratch_bytes(max_tokens, n) : 0);
  }

  template <typename T>
  static T* at(void* ws, size_t offset) {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ws) + offset);
  }
  template <typename T>
  static const T* at(const void* ws, size_t offset) {
    return reinterpret_cast<const T*>(static_cast<const uint8_t*>(ws) + offset);
  }
};

}  // namespace qparity::gpu
