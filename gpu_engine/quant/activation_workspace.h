#pragma once
// The workspace layout every activation-quantized GPU method uses inside the engine's shared
// workspace, for t tokens of k inputs and n outputs, each part 256-byte aligned:
//   codes    [t, k]            one byte a code (int8 or e4m3fn)
//   scales   [t, scale_cols]   fp32, the codes' scales (what the dumps' x_scales hold)
//   extra    `extra_bytes`     fp32 scratch of the quantizer (fp8's per-tensor amax)
//   product  int32 [t, n]      prefill-sized int8 batches' cuBLASLt product (int8_gemm.h)
#include <cstddef>
#include <cstdint>

#include "gpu_engine/kernels/int8_gemm.h"

namespace qparity::gpu {

struct ActivationWorkspace {
  int64_t k = 0, n = 0, scale_cols = 1;
  size_t extra_bytes = 0;
  bool int8_product = false;

  static size_t align(size_t v) { return (v + 255) / 256 * 256; }
  size_t scales_offset(int64_t t) const { return align(static_cast<size_t>(t * k)); }
  size_t extra_offset(int64_t t) const {
    return scales_offset(t) + align(static_cast<size_t>(t * scale_cols) * sizeof(float));
  }
  size_t product_offset(int64_t t) const { return extra_offset(t) + align(extra_bytes); }
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
