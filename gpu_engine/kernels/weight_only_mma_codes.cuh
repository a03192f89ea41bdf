#pragma once
// What both tilings of the tensor-core weight-only GEMM (weight_only_mma.h) share: each code
// expanded in registers to the exact bf16 value the A fragment takes, the mma, and the terms a
// group gives its steps (the scale of each of a lane's rows, and the expansion's subtrahend).
#include <cuda_bf16.h>

#include <cstdint>

#include "gpu_engine/kernels/scale_load.cuh"
#include "gpu_engine/kernels/weight_only_mma.h"

namespace qparity::gpu {

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ __nv_bfloat162 as_bf16x2(uint32_t u) {
  return *reinterpret_cast<__nv_bfloat162*>(&u);
}

// d = A(16x16, bf16) * B(16x8, bf16), fp32, no accumulator input (not volatile: the
// scheduler may move it among the loads).
__device__ __forceinline__ void mma_bf16_fresh(const uint32_t a[4], uint2 b, float d[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "f"(0.f));
}

// c += A * B in the tensor core's fp32 accumulation (not volatile, as above).
__device__ __forceinline__ void mma_bf16_acc(const uint32_t a[4], uint2 b, float c[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// A warp's group runs (run[tile][token tile][fragment]) start at zero; at a run's end its sums,
// times the group's scale of each row, join the fp32 accumulator.
template <int kT>
__device__ __forceinline__ void zero_runs(float (&run)[2][kT][4]) {
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        run[t][j][e] = 0.f;
}
template <int kT>
__device__ __forceinline__ void fold_runs(const float (&run)[2][kT][4], const float (&scale)[2][2],
                                          float (&acc)[2][kT][4]) {
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < kT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[t][j][e] = fmaf(run[t][j][e], scale[t][e / 2], acc[t][j][e]);
}

// int4: pair j of a step's word is nibbles j and j + 4, u = q + 8. 0x4300 | u is the bf16 value
// 128 + u; minus the bf16 integer 136 + zero it is q - zero, exactly.
__device__ __forceinline__ void expand_int4(uint32_t w, uint32_t sub_lo, uint32_t sub_hi,
                                            uint32_t a[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t t = ((w >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
    a[j] = bf16x2_bits(__hsub2(as_bf16x2(t), as_bf16x2(j % 2 == 0 ? sub_lo : sub_hi)));
  }
}

// int8: byte b of w (a signed code) as the fp32 value 2^23 + q + 128 (prmt onto 0x4B000000),
// minus 2^23 + 128 + zero: q - zero, exactly; |q - zero| <= 255 is a bf16 value.
__device__ __forceinline__ float int8_minus(uint32_t w_biased, int b, float sub) {
  return __uint_as_float(__byte_perm(w_biased, 0x4B000000u, 0x7440u | b)) - sub;
}
__device__ __forceinline__ void expand_int8(uint32_t w0, uint32_t w1, float sub_lo, float sub_hi,
                                            uint32_t a[4]) {
  const uint32_t b0 = w0 ^ 0x80808080u, b1 = w1 ^ 0x80808080u;
  a[0] = bf16x2_bits(__floats2bfloat162_rn(int8_minus(b0, 0, sub_lo), int8_minus(b0, 1, sub_lo)));
  a[1] = bf16x2_bits(__floats2bfloat162_rn(int8_minus(b0, 2, sub_hi), int8_minus(b0, 3, sub_hi)));
  a[2] = bf16x2_bits(__floats2bfloat162_rn(int8_minus(b1, 0, sub_lo), int8_minus(b1, 1, sub_lo)));
  a[3] = bf16x2_bits(__floats2bfloat162_rn(int8_minus(b1, 2, sub_hi), int8_minus(b1, 3, sub_hi)));
}

// e4m3fn: sign to bit 15, exponent and mantissa to bits 4..10 give the bf16 value e4m3 * 2^-120
// (subnormals included); times 2^120 (exact) it is the e4m3 value.
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t w, uint32_t selector) {
  const uint32_t t = __byte_perm(w, 0u, selector);
  const uint32_t bits = ((t & 0x00800080u) << 8) | ((t & 0x007F007Fu) << 4);
  return bf16x2_bits(__hmul2(as_bf16x2(bits), as_bf16x2(0x7B807B80u)));
}
__device__ __forceinline__ void expand_e4m3(uint32_t w0, uint32_t w1, uint32_t a[4]) {
  a[0] = e4m3_pair(w0, 0x4140u);
  a[1] = e4m3_pair(w0, 0x4342u);
  a[2] = e4m3_pair(w1, 0x4140u);
  a[3] = e4m3_pair(w1, 0x4342u);
}

// A group's terms for the two row tiles of a warp: the fp32 scale of rows r and r + 8 of each
// tile, and the subtrahend of the code expansion (bf16 136 + zero for int4, fp32 2^23 + 128 + zero
// for int8).
struct GroupTerms {
  float scale[2][2];  // [tile][row r, row r + 8]
  uint32_t sub_bf16[2][2];
  float sub_f32[2][2];
};

template <MmaCodes kC, typename S, bool kZeros>
__device__ __forceinline__ void load_group_terms(const WeightOnlyMmaParams& p, int64_t tile0,
                                                 int64_t groups, int64_t g, int r, GroupTerms& gt) {
  if (p.fault_group_off_by_one && g + 1 < groups) ++g;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t at = ((tile0 + t) * groups + g) * 16 + r + 8 * h;
      gt.scale[t][h] = load_scale<S>(p.scales, at);
      const int z = kZeros ? static_cast<int>(__ldg(p.zeros + at)) : 0;
      const __nv_bfloat16 v = __float2bfloat16_rn(static_cast<float>(136 + z));
      gt.sub_bf16[t][h] = bf16x2_bits(__halves2bfloat162(v, v));
      gt.sub_f32[t][h] = static_cast<float>(8388608 + 128 + z);
    }
}

// The same terms from a staged copy of the scales (and zeros) of a chunk's groups,
// [tile][group - first][16 rows] with `stride` groups a tile, `gi` the group's index there.
template <MmaCodes kC, typename S, bool kZeros>
__device__ __forceinline__ void group_terms_from(const S* scales, const int8_t* zeros, int stride,
                                                 int gi, int r, GroupTerms& gt) {
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int at = (t * stride + gi) * 16 + r + 8 * h;
      gt.scale[t][h] = load_scale<S>(scales, at);
      const int z = kZeros ? static_cast<int>(zeros[at]) : 0;
      const __nv_bfloat16 v = __float2bfloat16_rn(static_cast<float>(136 + z));
      gt.sub_bf16[t][h] = bf16x2_bits(__halves2bfloat162(v, v));
      gt.sub_f32[t][h] = static_cast<float>(8388608 + 128 + z);
    }
}

// The A fragment of step s (16 columns) of tile t from the lane's 16-byte chunk loads: int4 one
// chunk a 64-column tile (word s), int8 / e4m3 one chunk per 32 columns (chunk s / 2, words
// 2 (s % 2) and 2 (s % 2) + 1).
template <MmaCodes kC>
__device__ __forceinline__ void expand_step(const uint4& chunk, int word, const GroupTerms& gt,
                                            int t, uint32_t a[4]) {
  const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
  if constexpr (kC == MmaCodes::kInt4)
    expand_int4(w[word], gt.sub_bf16[t][0], gt.sub_bf16[t][1], a);
  else if constexpr (kC == MmaCodes::kInt8)
    expand_int8(w[word], w[word + 1], gt.sub_f32[t][0], gt.sub_f32[t][1], a);
  else
    expand_e4m3(w[word], w[word + 1], a);
}

}  // namespace qparity::gpu
