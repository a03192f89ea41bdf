#pragma once
// An e4m3fn byte as the integer its value is on the 2^-9 lattice (value * 2^9, exact): subnormals
// m (m * 2^-9), normals (8 + m) * 2^(e - 1); sign by the top bit. NaN bytes (0x7F / 0xFF) give
// 15 * 2^14, so callers never pass them (weights are checked at load, activation codes saturate).
// |result| <= 448 * 2^9 = 229376 (18 bits), so integer sums of products with small integers stay
// exact in int32 (kernels/int_group_gemm.h).
#include <cstdint>

namespace qparity::gpu {

__device__ __forceinline__ int e4m3_lattice(uint32_t byte) {
  const int e = static_cast<int>((byte >> 3) & 0xF), m = static_cast<int>(byte & 0x7);
  const int v = e == 0 ? m : (8 + m) << (e - 1);
  return (byte & 0x80) ? -v : v;
}

// The byte's value as fp32 (exact: 4 significant bits).
__device__ __forceinline__ float e4m3_value(uint32_t byte) {
  return static_cast<float>(e4m3_lattice(byte)) * 0x1p-9f;
}

}  // namespace qparity::gpu
