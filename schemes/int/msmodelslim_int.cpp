#include "schemes/int/msmodelslim_int.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qparity::reference {

MsIntRules ms_int_rules(Dialect d) {
  switch (d) {
    case Dialect::kIdeal:
      return {Arith::kFp64, IntRound::kHalfEven};
    case Dialect::kMsModelSlim:
    case Dialect::kCompressedTensors:
    case Dialect::kVllm:
    case Dialect::kSglang:
      return {Arith::kFp32, IntRound::kHalfEven};
  }
  return {};
}

int64_t ms_int_min(int bits) {
  return -(int64_t{1} << (bits - 1));
}
int64_t ms_int_max(int bits) {
  return (int64_t{1} << (bits - 1)) - 1;
}

MsIntQParams ms_int_qparams(double min, double max, bool symmetric, const MsIntRules& r, int bits) {
  if (!std::isfinite(min) || !std::isfinite(max) || min > max)
    throw Error("msmodelslim qparams", "min/max must be finite with min <= max (got " +
                                           std::to_string(min) + ", " + std::to_string(max) + ")");
  const Arith a = r.arith;
  const double mn = in(a, std::min(min, 0.0));
  const double mx = in(a, std::max(max, 0.0));
  MsIntQParams p;
  if (symmetric) {
    const double qmax = static_cast<double>(ms_int_max(bits));
    p.scale = std::max(div_in(a, std::max(-mn, mx), qmax), kFltEpsilon);
    p.offset = 0.0;
  } else {
    const double range = static_cast<double>((int64_t{1} << bits) - 1);
    p.scale = std::max(sub_in(a, div_in(a, mx, range), div_in(a, mn, range)), kFltEpsilon);
  }
  // The file holds fp32: in fp64 the scale is rounded once here (in fp32 it already is).
  p.scale = to_f32(p.scale);
  if (!symmetric)
    p.offset = round_int(div_in(a, -mn, p.scale), r.round) + static_cast<double>(ms_int_min(bits));
  return p;
}

int64_t ms_int_quantize(double x, const MsIntQParams& p, const MsIntRules& r, ScaleUse use,
                        int bits) {
  const double scaled = apply_scale(x, p.scale, use, r.arith);
  const double shifted = add_in(r.arith, scaled, p.offset);
  return quantize_int(shifted, r.round, ms_int_min(bits), ms_int_max(bits));
}

}  // namespace qparity::reference
