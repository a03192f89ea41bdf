#pragma once
// The register-blocked tile loops of the product kernels (simd_kernels.h), written once over an
// instruction set's vector operations `Ops` (V, kLanes, zero, load, store, set1, fma). Included
// only by the kernels' own translation units, inside an anonymous namespace there (after
// simd_kernels.h, which brings <cstdint>), so every instantiation is local to the unit compiled for
// its instruction set.

// kTokens tokens x (kVecs * kLanes) panel rows of independent sums: kTokens * kVecs accumulators
// in registers, each one output's fused multiply-add chain over ascending j.
template <class Ops, int kVecs, int kTokens>
[[gnu::always_inline]] inline void dot_tile(const double* const* x, const double* panel, int64_t j0,
                                            int64_t j1, bool fresh, double* out) {
  using V = typename Ops::V;
  constexpr int kLanes = Ops::kLanes;
  constexpr int kRows = kVecs * kLanes;
  // Fully unrolled, so the accumulators live in registers (GCC does not unroll these constant
  // loops by itself at -O2 and kept them on the stack: a third of the speed).
  V acc[kTokens][kVecs];
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v)
      acc[t][v] = fresh ? Ops::zero() : Ops::load(out + t * kRows + v * kLanes);
  for (int64_t j = j0; j < j1; ++j) {
    const double* pj = panel + (j - j0) * kRows;
    V w[kVecs];
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v)
      w[v] = Ops::load(pj + v * kLanes);
#pragma GCC unroll 16
    for (int t = 0; t < kTokens; ++t) {
      const V xx = Ops::set1(x[t][j]);
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v)
        acc[t][v] = Ops::fma(xx, w[v], acc[t][v]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < kTokens; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v)
      Ops::store(out + t * kRows + v * kLanes, acc[t][v]);
}

// The last tokens, fewer than a tile: one tile of exactly that many (a one-token tile has only
// kVecs chains, a quarter of the FMA units' latency cover).
template <class Ops, int kVecs, int kTokens>
[[gnu::always_inline]] inline void dot_tail(int64_t left, const double* const* x,
                                            const double* panel, int64_t j0, int64_t j1, bool fresh,
                                            double* out) {
  if constexpr (kTokens > 0) {
    if (left == kTokens)
      dot_tile<Ops, kVecs, kTokens>(x, panel, j0, j1, fresh, out);
    else
      dot_tail<Ops, kVecs, kTokens - 1>(left, x, panel, j0, j1, fresh, out);
  }
}

template <class Ops, int kVecs, int kTile>
[[gnu::always_inline]] inline void dot_panel_tiles(const double* const* x, int64_t tokens,
                                                   const double* panel, int64_t j0, int64_t j1,
                                                   bool fresh, double* out) {
  constexpr int kRows = kVecs * Ops::kLanes;
  int64_t t = 0;
  for (; t + kTile <= tokens; t += kTile)
    dot_tile<Ops, kVecs, kTile>(x + t, panel, j0, j1, fresh, out + t * kRows);
  if (t < tokens)
    dot_tail<Ops, kVecs, kTile - 1>(tokens - t, x + t, panel, j0, j1, fresh, out + t * kRows);
}

// The bf16 codes past the last full vector, one at a time.
[[gnu::always_inline]] inline void widen_bf16_tail(const uint8_t* bytes, double* out, int64_t i,
                                                   int64_t n) {
  for (; i < n; ++i) {
    uint16_t c;
    __builtin_memcpy(&c, bytes + 2 * i, 2);
    const uint32_t f32 = static_cast<uint32_t>(c) << 16;
    float f;
    __builtin_memcpy(&f, &f32, 4);
    out[i] = static_cast<double>(f);
  }
}

#ifndef QPARITY_NO_AVX_TRANSPOSE
// The transpose of kRows rows of width w, 4 x 4 doubles at a time in AVX registers (the load and
// store pattern the panel wants: four rows' four columns in, four columns' four rows out), the
// last w % 4 columns one element at a time. Needs AVX (unpack, permute2f128).
template <int kRows>
[[gnu::always_inline]] inline void transpose_4x4_blocks(const double* block, int64_t w,
                                                        double* panel) {
  static_assert(kRows % 4 == 0);
  int64_t c = 0;
  for (; c + 4 <= w; c += 4)
#pragma GCC unroll 8
    for (int g = 0; g < kRows; g += 4) {
      const __m256d a = _mm256_loadu_pd(block + (g + 0) * w + c);
      const __m256d b = _mm256_loadu_pd(block + (g + 1) * w + c);
      const __m256d d = _mm256_loadu_pd(block + (g + 2) * w + c);
      const __m256d e = _mm256_loadu_pd(block + (g + 3) * w + c);
      const __m256d ab_even = _mm256_unpacklo_pd(a, b), ab_odd = _mm256_unpackhi_pd(a, b);
      const __m256d de_even = _mm256_unpacklo_pd(d, e), de_odd = _mm256_unpackhi_pd(d, e);
      _mm256_storeu_pd(panel + (c + 0) * kRows + g, _mm256_permute2f128_pd(ab_even, de_even, 0x20));
      _mm256_storeu_pd(panel + (c + 1) * kRows + g, _mm256_permute2f128_pd(ab_odd, de_odd, 0x20));
      _mm256_storeu_pd(panel + (c + 2) * kRows + g, _mm256_permute2f128_pd(ab_even, de_even, 0x31));
      _mm256_storeu_pd(panel + (c + 3) * kRows + g, _mm256_permute2f128_pd(ab_odd, de_odd, 0x31));
    }
  for (; c < w; ++c)
    for (int r = 0; r < kRows; ++r)
      panel[c * kRows + r] = block[r * w + c];
}
#endif
