#pragma once
// The one input every scheme's `quantize_<scheme>()` takes: a floating-point linear weight (and
// bias), the producer's args, calibration statistics for static-activation schemes, and the
// dialect whose arithmetic to reproduce. The result is a TensorMap named exactly as the
// producer writes the tensors relative to the linear's prefix.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "schemes/description/dialect.h"
#include "schemes/description/quant_args.h"
#include "schemes/math/matmul.h"
#include "schemes/method/host_tensor.h"

namespace qparity::reference {

// Statistics of a linear's input over calibration tokens (from running the reference).
struct ActivationStats {
  double min = 0.0;  // over every element seen
  double max = 0.0;
  std::vector<double> channel_absmax;  // per input channel [K] (smooth-quant); may be empty
};

struct QuantizeRequest {
  Matrix weight;                            // [N, K], finite
  std::optional<std::vector<double>> bias;  // [N]
  DType model_dtype = DType::kBF16;         // the float checkpoint's dtype (scale dtype in CT)
  Dialect dialect = Dialect::kIdeal;
  // The producer's description; unset means the scheme's default (core implied_args()).
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  std::optional<ActivationStats> activations;  // required by static-activation schemes
  int64_t group_size = 0;                      // w8a16-g<N>: N
  // NVFP4: the amax the weight global scale is computed from when the linear is one partition
  // of a fused layer (q/k/v, gate/up, an expert's w1/w3): the group's largest, as llm-compressor
  // makes the partitions share one global scale (update_fused_layer_weight_global_scales: the
  // minimum of 2688/amax; from 0.11 its observers' joint absmax, the same value). Unset: this
  // weight's own amax.
  std::optional<double> fused_weight_amax;
  // The checkpoint layout to write; empty: the scheme's own under the dialect (method_config's
  // format). kPackedInt points also write "gptq", "gptq_v2" (GPTQ's qweight / qzeros / scales /
  // g_idx) and "awq" (AutoAWQ GEMM), each with that producer's round-to-nearest rule.
  std::string format;
  std::string where = "weight";  // names the linear in errors
};

// Adds the request's bias (if any) to a quantize() result as `bias` [N] in `dtype` (the model
// dtype, or F32 where the producer writes FLOAT), rounded once; checks its length and finiteness.
void add_bias(TensorMap& out, const QuantizeRequest& r, DType dtype);

}  // namespace qparity::reference
