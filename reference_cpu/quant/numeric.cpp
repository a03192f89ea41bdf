#include "reference_cpu/quant/numeric.h"

#include <algorithm>
#include <cmath>

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
      return codec::round_to(codec::kBF16, static_cast<float>(x), codec::Overflow::kNonSaturating);
    case Arith::kFp16:
      return codec::round_to(codec::kFP16, static_cast<float>(x), codec::Overflow::kNonSaturating);
  }
  return x;
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
