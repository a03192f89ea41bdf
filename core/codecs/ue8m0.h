#pragma once
// UE8M0 (E8M0) scale bytes: an unsigned biased exponent, byte e in [0, 254] means 2^(e-127),
// 0xFF is NaN; there is no zero and no sign (FORMATS.md 1.4).
// Precision contract: decode is exact. encode takes |x| (the sign is dropped, as torch and CUDA
// do), computes floor(log2|x|) exactly from the double's exponent, then rounds:
//   kTowardZero: 2^floor(log2|x|)             (CUDA cudaRoundZero)
//   kUp:         smallest 2^e >= |x|          (CUDA cudaRoundPosInf; DeepGEMM's ceil(log2 s))
//   kNearest:    nearest power of two, ties (|x| = 1.5 * 2^e) upward (torch .to(float8_e8m0fnu))
// Values below 2^-127 (including 0) give byte 0, the smallest scale: converters disagree on 0
// (torch 0x00, ml_dtypes 0xFF), so quantizers should never pass 0 here. NaN -> 0xFF. Results
// above 2^127 (and +-inf): kSaturate -> 0xFE, kNonSaturating -> 0xFF (NaN); except that a finite
// input rounded toward zero gives 0xFE in both modes (IEEE 754's overflow rule for directed
// rounding toward zero, which CUDA's cvt.rz follows).
#include <cstdint>

#include "core/codecs/float_format.h"

namespace qparity::codec {

enum class Ue8m0Rounding { kTowardZero, kUp, kNearest };

inline constexpr uint8_t kUe8m0Nan = 0xFF;

double ue8m0_to_double(uint8_t code);
uint8_t double_to_ue8m0(double x, Ue8m0Rounding rounding, Overflow overflow);

}  // namespace qparity::codec
