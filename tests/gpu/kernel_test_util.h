#pragma once
// Helpers of the kernel tests: bf16-representable random inputs (so the fp64 reference op and the
// kernel see the same numbers), device round trips, and the relative L2 error every kernel test
// is judged by (NaN when an output is NaN: poisoned outputs that a kernel failed to write fail).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "schemes/math/matmul.h"

namespace qparity::test {

using Bf16 = __nv_bfloat16;

inline double bf16_value(Bf16 b) {
  return static_cast<double>(__bfloat162float(b));
}
inline Bf16 to_bf16(double x) {
  return __float2bfloat16_rn(static_cast<float>(x));
}

// rows x cols values, each a bf16 number drawn from N(0, sigma): `host` holds the bf16 codes,
// the returned Matrix the same values as doubles.
inline Matrix random_bf16(std::mt19937_64& rng, int64_t rows, int64_t cols, double sigma,
                          std::vector<Bf16>& host) {
  std::normal_distribution<double> n(0.0, sigma);
  Matrix m(rows, cols);
  host.resize(m.data.size());
  for (size_t i = 0; i < m.data.size(); ++i) {
    host[i] = to_bf16(n(rng));
    m.data[i] = bf16_value(host[i]);
  }
  return m;
}

inline std::vector<double> to_doubles(const std::vector<Bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    d[i] = bf16_value(v[i]);
  return d;
}

// ||got - want|| / ||want||, NaN if any got is NaN or Inf.
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  long double e = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    const long double d = static_cast<long double>(got[i]) - want[i];
    e += d * d;
    r += static_cast<long double>(want[i]) * want[i];
  }
  return static_cast<double>(std::sqrt(e / r));
}

// Every kernel rounds its output to bf16 once, as the reference's emulate mode stores tensors, so
// a kernel is compared with the fp64 reference op rounded to bf16 the same way. The two then
// differ only where the kernel's fp32 arithmetic (relative error ~n * 2^-24 over an n-term sum,
// far below a bf16 half-ULP, 2^-9..2^-8) lands on the other side of a rounding boundary: a
// one-ULP flip on a fraction ~n * 2^-24 / 2^-9 of the elements, relative L2 ~2^-8 * sqrt of that,
// about 1e-4 for n = 4096. kFlipBound = 2^-10 is ten times that, and a quarter of what one
// systematic extra rounding (RMS ~2^-8.5 / sqrt(3)) or an off-by-one-ULP bias would give.
constexpr double kFlipBound = 0x1p-10;

inline std::vector<double> round_bf16(std::vector<double> v) {
  for (double& x : v)
    x = bf16_value(__double2bfloat16(x));
  return v;
}

}  // namespace qparity::test
