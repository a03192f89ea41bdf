#pragma once
// Dialects: the last-bit choices that producers and engines make differently for the same format
// (spec/FORMATS.md §6): the integer scale divisor (127 vs 127.5), the rounding of activation
// codes (half-even, half-away, truncation), x/s vs x*(1/s), scale floors, the precision scales
// are computed in (fp64, fp32, the model dtype), UE8M0 exponent rules, NVFP4 global-scale
// reconciliation on fused layers, the fp16 round trip of w13 unification.
//
// A dialect is chosen once (--dialect) and recorded in every output. Each scheme maps it onto
// its own rules struct (e.g. Fp8Rules, Int8ActRules) in its own file; the mapping is documented
// there with the source of each choice. A producer-only dialect used for an engine step (or the
// reverse) falls back to the nearest documented behaviour and the scheme file says which.
//   ideal              exact fp64 arithmetic, round-half-even, no floors beyond what keeps a
//                      scale finite and positive; the format's math as written, with no engine's
//                      shortcuts. "Format error" is measured in this dialect.
//   compressed-tensors the producer library (llm-compressor's math): /127.5, scales in the
//                      model dtype, x/s, zero scale -> dtype eps.
//   vllm               vLLM kernels and their test references.
//   sglang             SGLang kernels (Triton / sgl-kernel) and loaders.
//   msmodelslim        msModelSlim's quantizer and the Ascend NPU loaders / ops.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace qparity {

enum class Dialect : uint8_t { kIdeal, kCompressedTensors, kVllm, kSglang, kMsModelSlim };

inline constexpr Dialect kAllDialects[] = {Dialect::kIdeal, Dialect::kCompressedTensors,
                                           Dialect::kVllm, Dialect::kSglang, Dialect::kMsModelSlim};

std::string_view to_string(Dialect d);
// "ideal", "compressed-tensors" (also "ct"), "vllm", "sglang", "msmodelslim"; case-insensitive.
// Unknown names throw an Error that lists the valid ones.
Dialect parse_dialect(std::string_view name);
std::string valid_dialects();
// One line per dialect, for `qparity schemes` and reports.
std::string_view describe(Dialect d);

}  // namespace qparity
