#include "schemes/method/quantize_request.h"

#include "core/error.h"
#include "schemes/math/numeric.h"

namespace qparity::reference {

void add_bias(TensorMap& out, const QuantizeRequest& r, DType dtype) {
  if (!r.bias) return;
  if (static_cast<int64_t>(r.bias->size()) != r.weight.rows)
    throw Error(r.where + ".bias", "has " + std::to_string(r.bias->size()) + " values for " +
                                       std::to_string(r.weight.rows) + " outputs");
  require_finite(*r.bias, r.where + ".bias");
  out["bias"] = encode(dtype, {r.weight.rows}, *r.bias, Encoding::kNearest, r.where + ".bias");
}

}  // namespace qparity::reference
