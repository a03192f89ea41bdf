#include "schemes/math/numeric.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/codecs/float_format.h"
#include "core/error.h"

namespace qparity::reference {

std::string_view to_string(Arith a) {
  switch (a) {
    case Arith::kFp64:
      return "fp64";
    case Arith::kFp32:
      return "fp32";
    case Arith::kBf16:
      return "bf16";
    case Arith::kFp16:
      return "fp16";
  }
  return "?";
}

std::string_view to_string(IntRound r) {
  switch (r) {
    case IntRound::kHalfEven:
      return "half-even";
    case IntRound::kHalfAway:
      return "half-away";
    case IntRound::kTowardZero:
      return "toward-zero";
  }
  return "?";
}

std::string_view to_string(ScaleUse s) {
  switch (s) {
    case ScaleUse::kDivide:
      return "x/s";
    case ScaleUse::kMultiplyReciprocal:
      return "x*(1/s)";
  }
  return "?";
}

Arith arith_of(DType model_dtype, const std::string& where) {
  switch (model_dtype) {
    case DType::kBF16:
      return Arith::kBf16;
    case DType::kF16:
      return Arith::kFp16;
    case DType::kF32:
      return Arith::kFp32;
    case DType::kF64:
      return Arith::kFp64;
    default:
      throw Error(where, "model dtype " + std::string(dtype_name(model_dtype)) +
                             " is not a floating-point type (expected BF16, F16, F32 or F64)");
  }
}

double in(Arith a, double x) {
  switch (a) {
    case Arith::kFp64:
      return x;
    case Arith::kFp32:
      return static_cast<double>(static_cast<float>(x));  // RNE on IEEE hosts
    case Arith::kBf16:
      // torch computes half ops in fp32 and rounds the fp32 result: two roundings.
      return bf16_of_float(static_cast<float>(x));
    case Arith::kFp16:
      return codec::round_to(codec::kFP16, static_cast<float>(x), codec::Overflow::kNonSaturating);
  }
  return x;
}

double bf16_of_float(float f) {
  if (std::isnan(f)) return std::copysign(std::numeric_limits<double>::quiet_NaN(), f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  // Add just under half an ulp of bf16, plus the kept lowest bit (ties to even), and cut: a carry
  // moves the exponent up as rounding should, and past the largest finite value to infinity.
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  float r;
  std::memcpy(&r, &bits, 4);
  return static_cast<double>(r);
}

double div_in(Arith p, double a, double b) {
  return in(p, in(p, a) / in(p, b));
}
double mul_in(Arith p, double a, double b) {
  return in(p, in(p, a) * in(p, b));
}
double add_in(Arith p, double a, double b) {
  return in(p, in(p, a) + in(p, b));
}
double sub_in(Arith p, double a, double b) {
  return in(p, in(p, a) - in(p, b));
}

double apply_scale(double x, double s, ScaleUse use, Arith p) {
  switch (use) {
    case ScaleUse::kDivide:
      return div_in(p, x, s);
    case ScaleUse::kMultiplyReciprocal:
      return mul_in(p, x, div_in(p, 1.0, s));
  }
  return x;
}

double round_int(double x, IntRound r) {
  switch (r) {
    case IntRound::kHalfEven:
      return std::nearbyint(x);  // default FE_TONEAREST: ties to even
    case IntRound::kHalfAway:
      return std::round(x);
    case IntRound::kTowardZero:
      return std::trunc(x);
  }
  return x;
}

int64_t quantize_int(double x, IntRound r, int64_t lo, int64_t hi) {
  const double c = std::clamp(x, static_cast<double>(lo), static_cast<double>(hi));
  return static_cast<int64_t>(round_int(c, r));
}

namespace {

static_assert(std::numeric_limits<long double>::digits >= 64,
              "exact quotient rounding needs a long double of at least 64 significand bits");

// Significant bits of a finite double (0 for 0).
int significant_bits(double v) {
  if (v == 0) return 0;
  int e = 0;
  double m = std::frexp(std::fabs(v), &e);  // m in [0.5, 1)
  int bits = 0;
  while (m != 0) {
    m = m * 2 - std::floor(m * 2);
    ++bits;
  }
  return bits;
}

// sign(x*mult - tie*den), exactly.
int compare_exact(double x, double mult, double tie, double den) {
  constexpr int kDigits = std::numeric_limits<long double>::digits;
  if (significant_bits(x) + significant_bits(mult) > kDigits ||
      significant_bits(tie) + significant_bits(den) > kDigits)
    throw Error("exact quotient", "operands too wide for an exact long double product");
  const long double a = static_cast<long double>(x) * static_cast<long double>(mult);
  const long double b = static_cast<long double>(tie) * static_cast<long double>(den);
  return a < b ? -1 : (a > b ? 1 : 0);
}

// Rounds |x|*mult/den with `round` (a monotone rounding to a grid whose adjacent values' midpoint
// is exact in fp64), deciding a tie within the fp64 quotient's error exactly; `even` says which
// of two adjacent grid values is the even one.
template <typename Round, typename Even>
double round_quotient(double x, double mult, double den, Round round, Even even) {
  if (!std::isfinite(x) || !std::isfinite(mult) || !std::isfinite(den) || !(den > 0) || !(mult > 0))
    throw Error("exact quotient", "needs finite x, mult > 0 and den > 0");
  const double ax = std::fabs(x);
  const double t = ax * mult / den;  // two roundings: within 2^-52 relative of the exact value
  constexpr double kSlack = 4 * std::numeric_limits<double>::epsilon();
  const double lo = round(t * (1 - kSlack)), hi = round(t * (1 + kSlack));
  double r = lo;
  if (lo != hi) {  // a midpoint of the grid lies within the error bound: decide it exactly
    const double tie = (lo + hi) / 2;
    const int c = compare_exact(ax, mult, tie, den);
    r = c < 0 ? lo : (c > 0 ? hi : (even(lo) ? lo : hi));
  }
  return std::signbit(x) ? -r : r;
}

}  // namespace

double e4m3_of_quotient(double x, double mult, double den) {
  return round_quotient(
      x, mult, den,
      [](double v) {
        return codec::round_to(codec::kE4M3FN, std::min(v, 448.0), codec::Overflow::kSaturate);
      },
      [](double v) {
        // The even code has an even mantissa field: v / (its spacing) is even.
        int e = 0;
        std::frexp(v, &e);                            // v in [2^(e-1), 2^e)
        const int ulp_exp = std::max(e - 1, -6) - 3;  // 3 mantissa bits; subnormals at 2^-9
        return std::fmod(std::ldexp(v, -ulp_exp), 2.0) == 0.0;
      });
}

double int_of_quotient(double x, double mult, double den) {
  return round_quotient(
      x, mult, den, [](double v) { return std::nearbyint(v); },
      [](double v) { return std::fmod(v, 2.0) == 0.0; });
}

double absmax(std::span<const double> v) {
  double m = 0.0;
  for (double x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

void require_finite(std::span<const double> v, const std::string& where) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw Error(where, std::string(std::isnan(v[i]) ? "NaN" : "Inf") + " at element " +
                             std::to_string(i) + " (inputs must be finite)");
}

}  // namespace qparity::reference
