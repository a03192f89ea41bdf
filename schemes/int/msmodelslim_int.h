#pragma once
// msModelSlim's integer quantization parameters and quant/dequant (spec/FORMATS.md §5.2,
// msmodelslim `ir/api/impl/int_quantization.py`), shared by W8A16, W8A8 (static) and the C8 KV
// cache.
//
//   min = min(min, 0), max = max(max, 0), eps = FLT_EPSILON (2^-23)
//   symmetric:  scale = max(max(-min, max) / (2^(b-1) - 1), eps)          offset = 0
//   asymmetric: scale = max(max/(2^b - 1) - min/(2^b - 1), eps)            (two divisions)
//               offset = round(-min/scale) - 2^(b-1)                        (torch.round: RNE)
//   quantize:   q = clamp(round(x/scale + offset), -2^(b-1), 2^(b-1) - 1)  (offset added BEFORE
//               rounding: round(0.5 + 1) = 2, round(0.5) + 1 = 1)
//   dequantize: x' = (q - offset) * scale
//
// Precision: every step is computed in `Arith` (kFp32 = the tool's torch fp32 tensors, each
// operation rounded once to fp32; kFp64 = the exact reference). The rounding to an integer is
// half-to-even (torch.round, FORMATS.md §1.6) and saturates to the int range after rounding
// (clamp then round with integer bounds is the same thing).
#include <cstdint>
#include <string>
#include <vector>

#include "schemes/description/dialect.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

struct MsIntQParams {
  double scale = 1.0;   // > 0, finite
  double offset = 0.0;  // integral, signed domain
};

// Producer rules of msModelSlim's integer math for a dialect.
//   kIdeal            qparams in fp64; the scale is then stored as fp32 (the file dtype) and the
//                     offset and the codes are computed from the STORED scale in fp64, so that
//                     (q - offset) * stored_scale is the dequantization of exactly what was
//                     rounded.
//   kMsModelSlim      fp32 tensors as the tool computes them (x/scale + offset in fp32).
//   kCompressedTensors, kVllm, kSglang: these projects do not produce msModelSlim files; they
//                     use the msModelSlim rule (fp32).
struct MsIntRules {
  Arith arith = Arith::kFp32;
  IntRound round = IntRound::kHalfEven;
};
MsIntRules ms_int_rules(Dialect d);

int64_t ms_int_min(int bits);  // -2^(b-1)
int64_t ms_int_max(int bits);  // 2^(b-1) - 1

// Qparams of one group from its min and max (before the min(.,0)/max(.,0) widening). The
// returned scale is already what the file stores (fp32): in kFp64 the fp64 scale is rounded to
// fp32 once and the offset recomputed from it.
MsIntQParams ms_int_qparams(double min, double max, bool symmetric, const MsIntRules& r,
                            int bits = 8);

// q = clamp(round(x/scale + offset)) with x/scale computed in r.arith (or x * (1/scale) when
// `use` is kMultiplyReciprocal, the NPU's npu_quantize with a stored reciprocal).
int64_t ms_int_quantize(double x, const MsIntQParams& p, const MsIntRules& r,
                        ScaleUse use = ScaleUse::kDivide, int bits = 8);

// (q - offset) * scale in fp64.
inline double ms_int_dequantize(int64_t q, const MsIntQParams& p) {
  return (static_cast<double>(q) - p.offset) * p.scale;
}

// The value a fp32 file stores for x (RNE).
inline double to_f32(double x) {
  return static_cast<double>(static_cast<float>(x));
}

}  // namespace qparity::reference
