#pragma once
// The independent peer for the codec tests: the CUDA toolkit's host-side conversions
// (cuda_fp8.h, cuda_fp4.h, cuda_bf16.h, cuda_fp16.h), compiled by the host compiler. They convert
// a double with a single rounding (bf16 via round-to-odd to float, fp16 via a pre-rounding
// shifter, fp8/fp4 on the double's bits), so they are exact peers for our double encoders.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/codecs/float_format.h"

namespace qparity::test {

inline uint32_t cuda_encode(const codec::FloatFormat& f, double x, codec::Overflow o) {
  const __nv_saturation_t sat = o == codec::Overflow::kSaturate ? __NV_SATFINITE : __NV_NOSAT;
  const std::string_view n = f.name;
  if (n == "fp8_e4m3fn") return __nv_cvt_double_to_fp8(x, sat, __NV_E4M3);
  if (n == "fp8_e5m2") return __nv_cvt_double_to_fp8(x, sat, __NV_E5M2);
  if (n == "fp4_e2m1") return __nv_cvt_double_to_fp4(x, __NV_E2M1, cudaRoundNearest);
  uint16_t bits = 0;
  if (n == "bf16") {
    const __nv_bfloat16 b = __double2bfloat16(x);
    std::memcpy(&bits, &b, 2);
  } else {
    const __half h = __double2half(x);
    std::memcpy(&bits, &h, 2);
  }
  // The 16-bit conversions have no saturating variant: satfinite means an infinite result of a
  // non-NaN input becomes the largest finite value of the same sign.
  const bool inf_result = (bits & 0x7FFFu) == (n == "bf16" ? 0x7F80u : 0x7C00u);
  if (o == codec::Overflow::kSaturate && inf_result && !std::isnan(x))
    bits = static_cast<uint16_t>((bits & 0x8000u) | (n == "bf16" ? 0x7F7Fu : 0x7BFFu));
  return bits;
}

inline double cuda_decode(const codec::FloatFormat& f, uint32_t code) {
  const std::string_view n = f.name;
  __half_raw hr;
  if (n == "fp8_e4m3fn") {
    hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  } else if (n == "fp8_e5m2") {
    hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E5M2);
  } else if (n == "fp4_e2m1") {
    hr = __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(code), __NV_E2M1);
  } else if (n == "bf16") {
    __nv_bfloat16_raw br;
    br.x = static_cast<unsigned short>(code);
    return static_cast<double>(__bfloat162float(__nv_bfloat16(br)));
  } else {
    hr.x = static_cast<unsigned short>(code);
  }
  return static_cast<double>(__half2float(__half(hr)));
}

}  // namespace qparity::test
