#pragma once
// Calibration for post-training quantization: runs the fp64 reference on calibration tokens and
// records what static-activation schemes, smooth-quant and KV-cache quantization need:
//   * per linear (checkpoint prefix, e.g. "model.layers.0.mlp.experts.3.down_proj"): the min and
//     max over every input element it saw and the per-input-channel max |x| (an expert sees only
//     the tokens routed to it);
//   * per attention module: the per-channel min and max of the keys (after q/k norm and RoPE,
//     as cached) and of the values.
// The model should be the unquantized checkpoint (statistics of the float model, as producers
// calibrate). The tokens are one sequence, run in chunks of `chunk` as prefill + continuation
// over the KV cache; the statistics do not depend on the chunking.
// calibrate() runs layer-major (every chunk through a layer, then the next layer; the hidden
// states of all tokens are held meanwhile, tokens x hidden fp64), so a streaming model
// (load_model's LayerStreaming) reads each decoder layer once; the statistics are bit for bit
// those of running the chunks one after the other through forward() (whole or streamed: the
// same bits). The head is not run (no statistic is taken there). `progress`: one line a layer.
#include <cstdint>
#include <map>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "reference_cpu/models/causal_lm.h"
#include "schemes/method/quantize_request.h"

namespace qparity::reference {

struct KvChannelStats {
  std::vector<double> k_min, k_max, v_min, v_max;  // [Hkv * D]
};

struct CalibrationStats {
  std::map<std::string, ActivationStats> linear_inputs;
  std::map<std::string, KvChannelStats> kv;
  int64_t tokens = 0;
};

CalibrationStats calibrate(CausalLm& model, std::span<const int64_t> tokens, int64_t chunk = 64,
                           std::ostream* progress = nullptr);

// Deterministic pseudo-random token ids in [0, vocab) for calibration when no text is given.
std::vector<int64_t> synthetic_tokens(int64_t count, int64_t vocab, uint64_t seed);

}  // namespace qparity::reference
