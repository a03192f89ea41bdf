#include "core/codecs/ue8m0.h"

#include <cmath>
#include <limits>

namespace qparity::codec {

double ue8m0_to_double(uint8_t code) {
  if (code == kUe8m0Nan) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, static_cast<int>(code) - 127);
}

uint8_t double_to_ue8m0(double x, Ue8m0Rounding rounding, Overflow overflow) {
  if (std::isnan(x)) return kUe8m0Nan;
  const uint8_t too_big = overflow == Overflow::kSaturate ? 0xFE : kUe8m0Nan;
  const double a = std::fabs(x);
  if (std::isinf(a)) return too_big;
  if (a == 0.0) return 0;
  int e = 0;
  const double frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  int exponent = e - 1;                   // floor(log2 a), exact
  switch (rounding) {
    case Ue8m0Rounding::kTowardZero:
      break;
    case Ue8m0Rounding::kUp:
      exponent += frac != 0.5 ? 1 : 0;
      break;
    case Ue8m0Rounding::kNearest:
      exponent += frac >= 0.75 ? 1 : 0;
      break;
  }
  if (exponent < -127) return 0;
  // IEEE 754: rounding toward zero never overflows to the special value; a finite input beyond
  // the range gives the largest finite scale (CUDA's cvt.rz does the same).
  if (exponent > 127) return rounding == Ue8m0Rounding::kTowardZero ? uint8_t{0xFE} : too_big;
  return static_cast<uint8_t>(exponent + 127);
}

}  // namespace qparity::codec
