#pragma once
// A deviation from the reference's own emulation, for measuring the judge (golden/judge_matrix.h):
// either a legitimate implementation choice a correct engine may make (other rounding points,
// other accumulation precision, more exact arithmetic), which the engine policy must PASS, or a
// planted fault (a bug engines have shipped), which it must FAIL at the planted capture point.
//
// A deviation only ever runs in a candidate: goldens are made without one (CausalLm starts with
// none and `golden make` / `validate` never set it), and every dump the matrix writes names its
// deviation in the producer. The arithmetic of each kind is stated in the table (deviation.cpp);
// kinds that name a layer change that one decoder layer, the others every layer.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qparity::reference {

enum class DeviationKind : uint8_t {
  kNone,
  // Legitimate implementation choices.
  kExactArithmetic,    // the model in fp64 (no bf16 rounding between ops): more exact
  kFp32Activations,    // activations stored in fp32 between ops (an fp32 engine)
  kNormTwoRoundings,   // RMSNorm: x * rsqrt rounded to bf16, then times w rounded (HF)
  kResidualFp32,       // the residual stream kept in fp32 (fused add + norm kernels)
  kRotaryRunDtype,     // cos / sin in bf16, q * cos and rotate_half(q) * sin each rounded (HF)
  kSiluRounded,        // silu(gate) rounded to bf16 before the product with up (HF act_fn)
  kFp32Accumulation,   // every dense linear accumulates in fp32, k ascending (a GEMM)
  kProbabilitiesBf16,  // attention probabilities rounded to bf16 before P.V (FlashAttention)
  // Planted faults.
  kBf16Accumulation,        // layer L's o_proj accumulates its dot products in bf16
  kNormInStorageDtype,      // layer L's input RMSNorm: squares, sum, rsqrt and products in bf16
  kNormEpsTenfold,          // every RMSNorm with 10 x the config's eps
  kRotaryBaseOff,           // rope_theta 1 % too large, every layer
  kPositionOffByOne,        // every token after the first rotated one position too far
  kRotaryPairsInterleaved,  // layer L rotates pairs (2i, 2i+1) where the model rotates halves
  kQkNormSkipped,           // layer L's per-head q / k RMSNorm not applied (Qwen3)
  kCausalMaskLeak,          // layer L: every query also sees the next token's key
  kKvSlotOffByOne,          // layer L: token 1's cache slot holds token 0's key and value
  kSoftmaxWithoutMax,       // layer L: softmax as exp(s) / sum exp(s) in fp32, no max subtracted
  kAttentionScaleOff,       // layer L: scaling 1 / sqrt(hidden / heads), not 1 / sqrt(head_dim)
  kGateUpSwapped,           // layer L: silu(up) * gate
  kChannelScaleOff,         // layer L's qkv output channel 3 times 1.03 (one scale 3 % off)
  kOutputTileUnwritten,     // layer L's qkv: the [0, 16) x [0, 16) tile left NaN (poisoned)
  kOutputTileZero,          // the same tile left at 0 (a zeroed buffer)
  kNeighbourExpert,         // layer L: expert 0's tokens run expert 1's weights
  kRouterNotRenormalized,   // layer L: top-k weights not renormalized (norm_topk_prob ignored)
};

// What the judge must say of a candidate with this deviation.
enum class DeviationExpectation : uint8_t {
  kPass,     // legitimate: the engine policy must PASS it
  kFail,     // a fault: FAIL, first at the planted point, bisect LOCAL there
  kMeasure,  // a fault the policy is not claimed to catch: the cell measures whether it does
};

struct DeviationInfo {
  DeviationKind kind;
  std::string_view name;  // "norm-two-roundings", "bf16-accumulation", ...
  DeviationExpectation expect;
  bool layer_scoped;  // changes layer L only (else every layer)
  // The capture point where the deviation first shows, as a suffix of layers.<L> (layer_scoped)
  // or of layers.0 (every layer); empty for legitimate choices.
  std::string_view first_point;
  std::string_view what;  // one sentence: the arithmetic
};

struct Deviation {
  DeviationKind kind = DeviationKind::kNone;
  static constexpr int64_t kChosenLayer = -1;  // "name" without @L: the runner picks the layer
  int64_t layer = 0;                           // layer-scoped kinds: the decoder layer changed
  bool any() const { return kind != DeviationKind::kNone; }
};

std::span<const DeviationInfo> deviation_table();
const DeviationInfo& deviation_info(DeviationKind k);
// "name" or "name@L" (a layer-scoped name without @L: layer kChosenLayer); an unknown name is an
// Error listing every name.
Deviation parse_deviation(std::string_view s);
std::string to_string(const Deviation& d);  // "name" or "name@L" (layer-scoped kinds)
// The capture point the deviation first changes ("" for legitimate choices).
std::string expected_first_point(const Deviation& d);

}  // namespace qparity::reference
