#include "gpu_engine/kernels/kv_quant.h"

#include <cmath>

#include "gpu_engine/kernels/launch_check.h"

namespace qparity::gpu {

std::string to_string(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kBf16:
      return "bf16";
    case KvCacheFormat::kInt8:
      return "int8";
    case KvCacheFormat::kFp8E4m3:
      return "fp8-e4m3";
  }
  return "?";
}

size_t kv_element_bytes(KvCacheFormat f) {
  return f == KvCacheFormat::kBf16 ? 2 : 1;
}

void require_kv_quant(const char* kernel, const KvQuant& q, int64_t num_kv_heads,
                      int64_t head_dim) {
  switch (q.format) {
    case KvCacheFormat::kBf16:
      return;
    case KvCacheFormat::kInt8:
      require(q.channels != nullptr && q.num_channels == num_kv_heads * head_dim, kernel,
              "an int8 KV cache needs its per-channel scales and offsets for num_kv_heads * "
              "head_dim = " +
                  std::to_string(num_kv_heads * head_dim) + " channels (got " +
                  std::to_string(q.num_channels) + ")");
      return;
    case KvCacheFormat::kFp8E4m3:
      require(
          std::isfinite(q.k_scale) && q.k_scale > 0 && std::isfinite(q.v_scale) && q.v_scale > 0,
          kernel, "an fp8 KV cache needs finite positive k_scale and v_scale");
      // Per-head scales (checked finite and > 0 on the host when uploaded).
      require(!q.fp8_heads || (q.fp8_num_heads == num_kv_heads && q.fp8_head_dim == head_dim),
              kernel,
              "per-head fp8 KV scales for " + std::to_string(q.fp8_num_heads) +
                  " heads of head_dim " + std::to_string(q.fp8_head_dim) + ", the cache has " +
                  std::to_string(num_kv_heads) + " of " + std::to_string(head_dim));
      return;
  }
  require(false, kernel, "unknown KV cache format");
}

}  // namespace qparity::gpu
