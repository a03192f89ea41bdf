// The AVX-512 product kernel (simd_kernels.h); this unit alone is compiled with -mavx512f -mfma and
// runs only where the CPU has AVX-512F (matmul.cpp checks).
// GCC 12 warns inside its own avx512fintrin.h that the _mm512_undefined_* operands of the
// conversions may be used uninitialized (GCC bug 105593); they are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "schemes/math/simd_kernels.h"

namespace qparity::reference::kernels {
namespace {

#include "schemes/math/simd_tiles.h"

struct Avx512 {
  using V = __m512d;
  static constexpr int kLanes = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static V set1(double v) { return _mm512_set1_pd(v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
};
// 8 tokens x 3 vectors: 24 accumulators + 3 weights + 1 broadcast of the 32 zmm registers.
static_assert(kAvx512Rows == 3 * Avx512::kLanes);

}  // namespace

void widen_bf16_avx512(const uint8_t* bytes, double* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + 2 * i));
    const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_storeu_pd(out + i, _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_castsi512_ps(bits))));
    _mm512_storeu_pd(out + i + 8,
                     _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(bits, 1))));
  }
  widen_bf16_tail(bytes, out, i, n);
}

void transpose_avx512(const double* block, int64_t w, double* panel) {
  transpose_4x4_blocks<kAvx512Rows>(block, w, panel);
}

void dot_panel_avx512(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                      int64_t j1, bool fresh, double* out) {
  dot_panel_tiles<Avx512, 3, 8>(x, tokens, panel, j0, j1, fresh, out);
}

}  // namespace qparity::reference::kernels
