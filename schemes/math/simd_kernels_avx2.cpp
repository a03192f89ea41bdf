// The AVX2 + FMA product kernel (simd_kernels.h); this unit alone is compiled with -mavx2 -mfma and
// runs only where the CPU has both (matmul.cpp checks).
#include <immintrin.h>

#include "schemes/math/simd_kernels.h"

namespace qparity::reference::kernels {
namespace {

#include "schemes/math/simd_tiles.h"

struct Avx2 {
  using V = __m256d;
  static constexpr int kLanes = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V set1(double v) { return _mm256_set1_pd(v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
};
// 6 tokens x 2 vectors: 12 accumulators + 2 weights + 1 broadcast of the 16 ymm registers.
static_assert(kAvx2Rows == 2 * Avx2::kLanes);

}  // namespace

void widen_bf16_avx2(const uint8_t* bytes, double* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm256_storeu_pd(out + i, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
    _mm256_storeu_pd(out + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
  }
  widen_bf16_tail(bytes, out, i, n);
}

void transpose_avx2(const double* block, int64_t w, double* panel) {
  transpose_4x4_blocks<kAvx2Rows>(block, w, panel);
}

void dot_panel_avx2(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                    int64_t j1, bool fresh, double* out) {
  dot_panel_tiles<Avx2, 2, 6>(x, tokens, panel, j0, j1, fresh, out);
}

}  // namespace qparity::reference::kernels
