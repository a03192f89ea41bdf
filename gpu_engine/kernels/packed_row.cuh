#pragma once
// A slice of a bf16 head row held packed in registers, for the attention kernels.
#include <cuda_bf16.h>

#include <cstdint>

namespace qparity::gpu {

// kN consecutive bf16 of a head row (lane l holds elements l*kN .. l*kN+kN-1), kept packed: half
// the registers of fp32, so eight keys' K and V stay in flight without spills or lost occupancy.
template <int kN>
struct PackedRow {
  uint32_t w[(kN + 1) / 2];
  __device__ __forceinline__ void load(const __nv_bfloat16* src) {
    if constexpr (kN % 8 == 0) {  // 16-byte loads (rows are 16-byte aligned: offsets are kN*lane)
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) {
        const uint4 v = reinterpret_cast<const uint4*>(src)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    } else if constexpr (kN % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kN / 4; ++i) {
        const uint2 v = reinterpret_cast<const uint2*>(src)[i];
        w[2 * i] = v.x, w[2 * i + 1] = v.y;
      }
    } else if constexpr (kN % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i)
        w[i] = reinterpret_cast<const uint32_t*>(src)[i];
    } else {  // odd widths: 2-byte loads
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
      for (int i = 0; i < (kN + 1) / 2; ++i)
        w[i] = static_cast<uint32_t>(h[2 * i]) |
               (2 * i + 1 < kN ? static_cast<uint32_t>(h[2 * i + 1]) << 16 : 0u);
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < (kN + 1) / 2; ++i)
      w[i] = 0u;
  }
  __device__ __forceinline__ void set(int j, __nv_bfloat16 v) {
    const uint32_t b = __bfloat16_as_ushort(v);
    w[j / 2] = (j & 1) ? ((w[j / 2] & 0xffffu) | (b << 16)) : ((w[j / 2] & 0xffff0000u) | b);
  }
  __device__ __forceinline__ __nv_bfloat16 bf16_at(int j) const {
    return __ushort_as_bfloat16(static_cast<unsigned short>((j & 1) ? (w[j / 2] >> 16) : w[j / 2]));
  }
  // bf16 -> fp32 is exact: the bf16 bits are the high half of the float.
  __device__ __forceinline__ float at(int j) const {
    return __uint_as_float((j & 1) ? (w[j / 2] & 0xffff0000u) : (w[j / 2] << 16));
  }
};

}  // namespace qparity::gpu
