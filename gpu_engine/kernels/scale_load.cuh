#pragma once
// A weight scale as fp32 from a grid held in bf16 (exactly: the loader narrows only exact values)
// or in fp32: what the integer-weight kernels (weight_only_gemm.h, int_group_gemm.h) read.
#include <cuda_bf16.h>

#include <cstdint>

namespace qparity::gpu {

template <typename S>
__device__ __forceinline__ float load_scale(const void* s, int64_t i) {
  if constexpr (sizeof(S) == 2)
    return __bfloat162float(static_cast<const __nv_bfloat16*>(s)[i]);
  else
    return static_cast<const float*>(s)[i];
}

}  // namespace qparity::gpu
