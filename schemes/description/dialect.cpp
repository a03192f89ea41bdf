#include "schemes/description/dialect.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace qparity {

std::string_view to_string(Dialect d) {
  switch (d) {
    case Dialect::kIdeal:
      return "ideal";
    case Dialect::kCompressedTensors:
      return "compressed-tensors";
    case Dialect::kVllm:
      return "vllm";
    case Dialect::kSglang:
      return "sglang";
    case Dialect::kMsModelSlim:
      return "msmodelslim";
  }
  return "?";
}

std::string_view describe(Dialect d) {
  switch (d) {
    case Dialect::kIdeal:
      return "exact fp64, round-half-even, x/s; the format's math with no engine shortcuts";
    case Dialect::kCompressedTensors:
      return "llm-compressor / compressed-tensors: int amax/127.5, scales in the model dtype, "
             "x/s, zero scale -> dtype eps";
    case Dialect::kVllm:
      return "vLLM kernels: fp32 scales, x*(1/s) for static fp8, per-token fp8 floor "
             "1/(448*512), int8 x*127/amax with RNE";
    case Dialect::kSglang:
      return "SGLang kernels: fp32 scales, amax floor 1e-10, int8 half-away rounding, "
             "row-major group quant x*(1/s), NVFP4 MoE shard-0/min global scales";
    case Dialect::kMsModelSlim:
      return "msModelSlim + Ascend NPU: int amax/127 with FLT_EPSILON floor, fp32 scales, "
             "NPU x*(1/s)+offset, (q + -offset)*s after loader negation";
  }
  return "?";
}

std::string valid_dialects() {
  std::string s;
  for (Dialect d : kAllDialects) {
    if (!s.empty()) s += ", ";
    s += to_string(d);
  }
  return s;
}

Dialect parse_dialect(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "ct" || lower == "compressed_tensors") lower = "compressed-tensors";
  for (Dialect d : kAllDialects)
    if (to_string(d) == lower) return d;
  throw Error("--dialect",
              "unknown dialect '" + std::string(name) + "'; valid dialects: " + valid_dialects());
}

}  // namespace qparity
