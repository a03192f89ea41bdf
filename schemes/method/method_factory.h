#pragma once
// Where a plan entry becomes a LinearMethod / KvCacheMethod, and the scheme-independent entry
// points over every scheme's quantize_<scheme>(): one switch over SchemeKind with no default, so
// a new scheme is a compile error here until it is handled.
#include <memory>

#include "schemes/description/quant_plan.h"
#include "schemes/kv/kv_cache_method.h"
#include "schemes/method/linear_method.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

// The MethodConfig of a plan entry under a dialect.
MethodConfig method_config(const PlanEntry& entry, Dialect dialect);
// The MethodConfig a bare scheme id implies (core implied_args(): the producer's preset). Under
// the msmodelslim dialect, schemes msModelSlim also writes take its file layout.
MethodConfig method_config(const SchemeId& scheme, Dialect dialect);

// Throws naming the layer when the scheme is not a weight scheme (KV cache, transform).
std::unique_ptr<LinearMethod> make_linear_method(LinearShape shape, MethodConfig config);
// Throws naming the attention layer when the scheme is not a KV-cache scheme.
std::unique_ptr<KvCacheMethod> make_kv_cache_method(KvShape shape, MethodConfig config);

// quantize_<scheme>(request) for a weight scheme. Unset request.weights / input_activations are
// filled from method_config(scheme) first.
TensorMap quantize_linear(const SchemeId& scheme, QuantizeRequest request);

// The generic dequantize: the [N, K] fp64 weight that `tensors` (one dense linear's checkpoint
// tensors) hold under `config`, through create_weights -> load -> process.
Matrix dequantize_linear(const MethodConfig& config, const TensorMap& tensors, int64_t out_features,
                         int64_t in_features, DType model_dtype);

}  // namespace qparity::reference
