#pragma once
// Small binary floating-point formats (bf16, fp16, fp8 e4m3fn / e5m2, fp4 e2m1) as one
// parameterized codec. Precision contract:
//   * decode(code) is exact: every code of these formats is a double.
//   * encode(x) rounds the double x once, to nearest, ties to even (RNE), on the format's grid
//     (subnormals included). There is no intermediate float: a double input is not first rounded
//     to fp32, which would double-round.
//   * Overflow: a value whose RNE result lies above the largest finite value overflows.
//     Saturate -> +-max finite (CUDA __NV_SATFINITE); NonSaturating -> +-inf where the format has
//     one, else NaN (torch's .to(float8_e4m3fn): 464 < |x| becomes NaN, FORMATS.md 1.1).
//     +-inf inputs follow the same rule. e2m1 has neither inf nor NaN and always saturates.
//   * NaN input: the format's NaN with the input's sign (e4m3fn: 0x7F/0xFF; IEEE formats: quiet
//     NaN). e2m1 cannot hold NaN: it gives +6 (0x7), as CUDA's cvt does (FORMATS.md 1.3).
//   * Underflow keeps the sign: -1e-30 encodes to -0.
#include <cstdint>
#include <string_view>

namespace qparity::codec {

enum class Overflow { kSaturate, kNonSaturating };

struct FloatFormat {
  std::string_view name;
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;  // exponent all-ones = inf (mantissa 0) / NaN (else), as IEEE 754
  bool has_nan;        // e4m3fn: only S.1111.111 is NaN; e2m1: no NaN at all
  int total_bits() const { return 1 + exp_bits + man_bits; }
  uint32_t sign_mask() const { return 1u << (exp_bits + man_bits); }
  uint32_t code_count() const { return 1u << total_bits(); }
};

inline constexpr FloatFormat kBF16{"bf16", 8, 7, 127, true, true};
inline constexpr FloatFormat kFP16{"fp16", 5, 10, 15, true, true};
inline constexpr FloatFormat kE4M3FN{"fp8_e4m3fn", 4, 3, 7, false, true};
inline constexpr FloatFormat kE5M2{"fp8_e5m2", 5, 2, 15, true, true};
inline constexpr FloatFormat kE2M1{"fp4_e2m1", 2, 1, 1, false, false};

// Classification of a code.
bool is_nan_code(const FloatFormat& f, uint32_t code);
bool is_inf_code(const FloatFormat& f, uint32_t code);

// Largest finite value (448 for e4m3fn, 57344 for e5m2, 6 for e2m1, 65504 for fp16, ...).
double max_finite(const FloatFormat& f);
// Smallest positive subnormal and normal values.
double min_subnormal(const FloatFormat& f);
double min_normal(const FloatFormat& f);

// Exact value of a code (NaN codes give a quiet NaN with the code's sign).
double decode(const FloatFormat& f, uint32_t code);
// RNE encode of a double (see the contract above).
uint32_t encode(const FloatFormat& f, double x, Overflow overflow);
// decode(encode(x)): the value x rounds to. Convenience for quantizers.
double round_to(const FloatFormat& f, double x, Overflow overflow);

// Named shorthands for the formats used across qparity.
inline double bf16_to_double(uint16_t c) {
  return decode(kBF16, c);
}
inline double fp16_to_double(uint16_t c) {
  return decode(kFP16, c);
}
inline double e4m3fn_to_double(uint8_t c) {
  return decode(kE4M3FN, c);
}
inline double e5m2_to_double(uint8_t c) {
  return decode(kE5M2, c);
}
inline double e2m1_to_double(uint8_t c) {
  return decode(kE2M1, c & 0xFu);
}
inline uint16_t double_to_bf16(double x, Overflow o = Overflow::kNonSaturating) {
  return static_cast<uint16_t>(encode(kBF16, x, o));
}
inline uint16_t double_to_fp16(double x, Overflow o = Overflow::kNonSaturating) {
  return static_cast<uint16_t>(encode(kFP16, x, o));
}
inline uint8_t double_to_e4m3fn(double x, Overflow o) {
  return static_cast<uint8_t>(encode(kE4M3FN, x, o));
}
inline uint8_t double_to_e5m2(double x, Overflow o) {
  return static_cast<uint8_t>(encode(kE5M2, x, o));
}
inline uint8_t double_to_e2m1(double x) {
  return static_cast<uint8_t>(encode(kE2M1, x, Overflow::kSaturate));
}

}  // namespace qparity::codec
