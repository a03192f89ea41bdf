#pragma once
// The arithmetic primitives every scheme composes, each with its rounding stated:
//   Arith      the precision one step is computed in. A step "in fp32" rounds its operands to
//              fp32 and its exact result to fp32 once (IEEE: + - * / are correctly rounded, so
//              float arithmetic on the host is exactly what a kernel's non-fast-math fp32
//              does). "In bf16" / "in fp16" is torch's CPU and CUDA behaviour for half tensors:
//              compute in fp32, round the fp32 result to the half type (two roundings, as the
//              frameworks do). kFp64 is the reference's own precision.
//   IntRound   how a real number becomes an integer code (FORMATS.md 1.6): half-even
//              (torch.round, PTX cvt.rni, rint), half-away (Triton libdevice.round,
//              microxcaling), toward zero (Triton .to(int8) after a clamp).
//   ScaleUse   x/s (division) or x*(1/s) (reciprocal first, rounded, then a multiply).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace qparity::reference {

enum class Arith : uint8_t { kFp64, kFp32, kBf16, kFp16 };
enum class IntRound : uint8_t { kHalfEven, kHalfAway, kTowardZero };
enum class ScaleUse : uint8_t { kDivide, kMultiplyReciprocal };

std::string_view to_string(Arith a);
std::string_view to_string(IntRound r);
std::string_view to_string(ScaleUse s);

// The arithmetic of a model dtype (BF16 -> kBf16, F16 -> kFp16, F32 -> kFp32, F64 -> kFp64).
// Throws naming `where` for a non-float dtype.
Arith arith_of(DType model_dtype, const std::string& where = "");

// x rounded to the precision of `a` (RNE; overflow gives +-inf as IEEE does).
double in(Arith a, double x);
// The bf16 of a float, round to nearest even (what codec::round_to(kBF16, f) gives: overflow to
// infinity, the sign of a NaN kept): by its bits, the hot step of every "in bf16" operation.
double bf16_of_float(float f);
// a op b computed in `p` (operands first rounded to p).
double div_in(Arith p, double a, double b);
double mul_in(Arith p, double a, double b);
double add_in(Arith p, double a, double b);
double sub_in(Arith p, double a, double b);
// x scaled by s as `use` says, in precision p: x/s, or x * (1/s) with 1/s rounded to p first.
double apply_scale(double x, double s, ScaleUse use, Arith p);

// Rounds x to an integer value (as a double) with rule r. NaN stays NaN.
double round_int(double x, IntRound r);
// Clamp to [lo, hi] then round with r: the order the frameworks use (clamp first; with integer
// bounds the order does not change the result). NaN is rejected by the caller, not here.
int64_t quantize_int(double x, IntRound r, int64_t lo, int64_t hi);

// Correctly rounded codes of an exact quotient x*mult/den (den > 0, finite operands): the
// ideal dialect's rule. Computing the quotient in fp64 first and then rounding to the format
// rounds twice: a quotient within an fp64 ulp of a tie between two codes (448*x/amax = 23 for
// bf16 x and amax, between the e4m3 values 22 and 24) can land on the wrong side. These round
// the fp64 quotient, and where a tie lies within its error bound decide the side exactly: both
// x*mult and tie*den are exact in long double (at least 64 significand bits; x and den have at
// most 53, mult and the tie at most 9: checked), so their comparison is exact.
// To e4m3fn, round-half-even, saturating at +-448 (values beyond clamp to the largest code).
double e4m3_of_quotient(double x, double mult, double den);
// To an integer value, round-half-even (clamp afterwards: with integer bounds the order does
// not change the result).
double int_of_quotient(double x, double mult, double den);

// Largest finite |x| over a span; NaN/Inf are the caller's business (checked on load).
double absmax(std::span<const double> v);

// Throws an Error naming `where` and the first offending index when v has a NaN or an Inf.
void require_finite(std::span<const double> v, const std::string& where);

// FLT_EPSILON = 2^-23 (msModelSlim's scale floor, vLLM's int8 min scale).
inline constexpr double kFltEpsilon = 1.1920928955078125e-07;

}  // namespace qparity::reference
