// The portable product kernel (simd_kernels.h): scalar fused multiply-adds through std::fma, the
// FMA instruction where the CPU has one and glibc's exact software fma where it does not, so a CPU
// without AVX2 gets the vector kernels' bits (slowly).
#include <cmath>

#include "schemes/math/simd_kernels.h"

namespace qparity::reference::kernels {
namespace {

#define QPARITY_NO_AVX_TRANSPOSE
#include "schemes/math/simd_tiles.h"

struct Scalar {
  using V = double;
  static constexpr int kLanes = 1;
  static double zero() { return 0.0; }
  static double load(const double* p) { return *p; }
  static void store(double* p, double v) { *p = v; }
  static double set1(double v) { return v; }
  static double fma(double a, double b, double c) { return std::fma(a, b, c); }
};
static_assert(kPortableRows == 4);

}  // namespace

void transpose_portable(const double* block, int64_t w, double* panel) {
  for (int64_t c = 0; c < w; ++c)
    for (int64_t r = 0; r < kPortableRows; ++r)
      panel[c * kPortableRows + r] = block[r * w + c];
}

void widen_bf16_portable(const uint8_t* bytes, double* out, int64_t n) {
  widen_bf16_tail(bytes, out, 0, n);
}

WidenBf16 widen_bf16() {
  static const WidenBf16 best = __builtin_cpu_supports("avx512f") ? widen_bf16_avx512
                                : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                    ? widen_bf16_avx2
                                    : widen_bf16_portable;
  return best;
}

void dot_panel_portable(const double* const* x, int64_t tokens, const double* panel, int64_t j0,
                        int64_t j1, bool fresh, double* out) {
  dot_panel_tiles<Scalar, 4, 4>(x, tokens, panel, j0, j1, fresh, out);
}

}  // namespace qparity::reference::kernels
