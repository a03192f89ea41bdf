#include "core/codecs/float_format.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qparity::codec {

namespace {

uint32_t exp_field_max(const FloatFormat& f) {
  return (1u << f.exp_bits) - 1u;
}
uint32_t man_mask(const FloatFormat& f) {
  return (1u << f.man_bits) - 1u;
}

// Biased exponent field and mantissa field of the largest finite code.
uint32_t max_finite_magnitude_code(const FloatFormat& f) {
  if (f.ieee_specials) return ((exp_field_max(f) - 1u) << f.man_bits) | man_mask(f);
  if (f.has_nan) return (exp_field_max(f) << f.man_bits) | (man_mask(f) - 1u);  // e4m3fn: 0x7E
  return (exp_field_max(f) << f.man_bits) | man_mask(f);                        // e2m1: 0x7
}

uint32_t nan_magnitude_code(const FloatFormat& f) {
  if (f.ieee_specials) return (exp_field_max(f) << f.man_bits) | (1u << (f.man_bits - 1));
  return (exp_field_max(f) << f.man_bits) | man_mask(f);
}

uint32_t inf_magnitude_code(const FloatFormat& f) {
  return exp_field_max(f) << f.man_bits;
}

// Magnitude code of a non-negative value that is exactly on the format's grid and <= max.
uint32_t code_of_grid_value(const FloatFormat& f, double v) {
  const int emin = 1 - f.bias;
  if (v == 0.0) return 0;
  if (v < std::ldexp(1.0, emin)) {
    // Subnormal: exponent field 0, value = m * 2^(emin - man_bits).
    return static_cast<uint32_t>(std::ldexp(v, f.man_bits - emin));
  }
  int e = 0;
  (void)std::frexp(v, &e);  // v = frac * 2^e, frac in [0.5, 1)
  const int unbiased = e - 1;
  const uint32_t man =
      static_cast<uint32_t>(std::ldexp(v, f.man_bits - unbiased)) - (1u << f.man_bits);
  return (static_cast<uint32_t>(unbiased + f.bias) << f.man_bits) | man;
}

}  // namespace

bool is_nan_code(const FloatFormat& f, uint32_t code) {
  const uint32_t mag = code & (f.sign_mask() - 1u);
  if (!f.has_nan) return false;
  if (f.ieee_specials) return (mag >> f.man_bits) == exp_field_max(f) && (mag & man_mask(f)) != 0;
  return mag == nan_magnitude_code(f);
}

bool is_inf_code(const FloatFormat& f, uint32_t code) {
  return f.ieee_specials && (code & (f.sign_mask() - 1u)) == inf_magnitude_code(f);
}

double max_finite(const FloatFormat& f) {
  return decode(f, max_finite_magnitude_code(f));
}
double min_subnormal(const FloatFormat& f) {
  return std::ldexp(1.0, 1 - f.bias - f.man_bits);
}
double min_normal(const FloatFormat& f) {
  return std::ldexp(1.0, 1 - f.bias);
}

double decode(const FloatFormat& f, uint32_t code) {
  const bool neg = (code & f.sign_mask()) != 0;
  const uint32_t mag = code & (f.sign_mask() - 1u);
  const uint32_t e = mag >> f.man_bits;
  const uint32_t m = mag & man_mask(f);
  double v;
  if (is_nan_code(f, code)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (is_inf_code(f, code)) {
    v = std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.man_bits)),
                   static_cast<int>(e) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

uint32_t encode(const FloatFormat& f, double x, Overflow overflow) {
  const uint32_t sign = std::signbit(x) ? f.sign_mask() : 0u;
  if (std::isnan(x)) {
    if (!f.has_nan) return max_finite_magnitude_code(f);  // e2m1: +6, CUDA's rule
    return sign | nan_magnitude_code(f);
  }
  const bool saturate = overflow == Overflow::kSaturate || (!f.ieee_specials && !f.has_nan);
  const uint32_t overflow_code =
      saturate ? max_finite_magnitude_code(f)
               : (f.ieee_specials ? inf_magnitude_code(f) : nan_magnitude_code(f));
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | overflow_code;
  if (a == 0.0) return sign;

  // Quantum of the binade that holds a (the subnormal quantum below the normal range). Scaling
  // by a power of two is exact, so a / quantum is exact and nearbyint applies RNE exactly once.
  const int emin = 1 - f.bias;
  int e = 0;
  (void)std::frexp(a, &e);
  const int unbiased = std::max(e - 1, emin);
  const int quantum_exp = unbiased - f.man_bits;
  const double steps = std::nearbyint(std::ldexp(a, -quantum_exp));  // default mode: RNE
  const double rounded = std::ldexp(steps, quantum_exp);
  if (rounded > max_finite(f)) return sign | overflow_code;
  return sign | code_of_grid_value(f, rounded);
}

double round_to(const FloatFormat& f, double x, Overflow overflow) {
  return decode(f, encode(f, x, overflow));
}

}  // namespace qparity::codec
