#include "reference_cpu/models/deviation.h"

#include <array>

#include "core/capture/capture_points.h"
#include "core/error.h"

namespace qparity::reference {

namespace {

using K = DeviationKind;
using E = DeviationExpectation;

constexpr std::array kTable = {
    DeviationInfo{K::kExactArithmetic, "exact-arithmetic", E::kPass, false, "",
                  "the whole model in fp64, no rounding between ops (an engine more exact than "
                  "the bf16 emulation)"},
    DeviationInfo{K::kFp32Activations, "fp32-activations", E::kPass, false, "",
                  "every stored activation rounded to fp32 instead of bf16 (an fp32 engine)"},
    DeviationInfo{K::kNormTwoRoundings, "norm-two-roundings", E::kPass, false, "",
                  "RMSNorm as transformers runs it in bf16: x * rsqrt(var + eps) rounded to "
                  "bf16, then w times it rounded again"},
    DeviationInfo{K::kResidualFp32, "residual-fp32", E::kPass, false, "",
                  "the residual stream kept in fp32 between layers (fused add + RMSNorm "
                  "kernels with an fp32 residual)"},
    DeviationInfo{K::kRotaryRunDtype, "rotary-bf16", E::kPass, false, "",
                  "rotary as transformers runs it in bf16: cos / sin rounded to bf16, q * cos and "
                  "rotate_half(q) * sin each rounded, their sum rounded"},
    DeviationInfo{K::kSiluRounded, "silu-rounded", E::kPass, false, "",
                  "silu(gate) rounded to bf16 before the product with up (transformers' "
                  "act_fn(gate_proj(x)) * up_proj(x))"},
    DeviationInfo{K::kFp32Accumulation, "fp32-accumulation", E::kPass, false, "",
                  "every dense linear accumulates in fp32, k ascending, one fp32 rounding per "
                  "product and per addition, then the output rounded to bf16 (a GEMM)"},
    DeviationInfo{K::kProbabilitiesBf16, "probabilities-bf16", E::kPass, false, "",
                  "attention probabilities rounded to bf16 before P.V (FlashAttention's P "
                  "operand)"},
    DeviationInfo{K::kBf16Accumulation, "bf16-accumulation", E::kFail, true, "attn.out",
                  "o_proj accumulates in bf16: one bf16 rounding per product and per addition"},
    DeviationInfo{K::kNormInStorageDtype, "norm-in-storage-dtype", E::kFail, true, "input_norm",
                  "the input RMSNorm computed in bf16: each square, the running sum, the mean, "
                  "rsqrt and both products rounded to bf16"},
    DeviationInfo{K::kNormEpsTenfold, "norm-eps-tenfold", E::kMeasure, false, "input_norm",
                  "every RMSNorm adds 10 x the config's rms_norm_eps"},
    DeviationInfo{K::kRotaryBaseOff, "rotary-base-off", E::kFail, false, "attn.rope_q",
                  "rope_theta 1 % too large"},
    DeviationInfo{K::kPositionOffByOne, "position-off-by-one", E::kFail, false, "attn.rope_q",
                  "every token after the first is rotated at its position + 1"},
    DeviationInfo{K::kRotaryPairsInterleaved, "rotary-pairs-interleaved", E::kFail, true,
                  "attn.rope_q",
                  "q and k rotated as pairs (2i, 2i + 1) where the model rotates halves "
                  "(i, i + d/2)"},
    DeviationInfo{K::kQkNormSkipped, "qk-norm-skipped", E::kFail, true, "attn.q_norm",
                  "the per-head q / k RMSNorm not applied"},
    DeviationInfo{K::kCausalMaskLeak, "causal-mask-leak", E::kFail, true, "attn.core",
                  "every query also sees the next token's key and value"},
    DeviationInfo{K::kKvSlotOffByOne, "kv-slot-off-by-one", E::kFail, true, "attn.core",
                  "token 1's cache slot holds token 0's key and value"},
    DeviationInfo{K::kSoftmaxWithoutMax, "softmax-without-max", E::kMeasure, true, "attn.core",
                  "softmax as exp(s) / sum exp(s) in fp32 without subtracting the max: wrong "
                  "only where a score passes 88 (fp32 exp overflows)"},
    DeviationInfo{K::kAttentionScaleOff, "attention-scale-off", E::kFail, true, "attn.core",
                  "scores scaled by 1 / sqrt(hidden / heads) instead of 1 / sqrt(head_dim) (only "
                  "where the two differ)"},
    DeviationInfo{K::kGateUpSwapped, "gate-up-swapped", E::kFail, true, "mlp.act",
                  "silu(up) * gate: the two halves of the fused gate_up exchanged"},
    DeviationInfo{K::kChannelScaleOff, "channel-scale-off", E::kFail, true, "attn.qkv",
                  "output channel 3 of the fused qkv times 1.03 (one channel's scale 3 % off)"},
    DeviationInfo{K::kOutputTileUnwritten, "output-tile-unwritten", E::kFail, true, "attn.qkv",
                  "the fused qkv's [0, 16) x [0, 16) tile never written (a NaN-poisoned buffer)"},
    DeviationInfo{K::kOutputTileZero, "output-tile-zero", E::kFail, true, "attn.qkv",
                  "the fused qkv's [0, 16) x [0, 16) tile left at 0 (a zeroed buffer)"},
    DeviationInfo{K::kNeighbourExpert, "neighbour-expert", E::kFail, true, "moe.expert_out",
                  "the tokens routed to expert 0 run expert 1's weights"},
    DeviationInfo{K::kRouterNotRenormalized, "router-not-renormalized", E::kFail, true,
                  "moe.topk_weights",
                  "the top-k routing weights not renormalized although norm_topk_prob is set"},
};
// Every kind but kNone has exactly one row, in enum order.
static_assert(kTable.size() == static_cast<size_t>(K::kRouterNotRenormalized));

}  // namespace

std::span<const DeviationInfo> deviation_table() {
  return kTable;
}

const DeviationInfo& deviation_info(DeviationKind k) {
  if (k == K::kNone || static_cast<size_t>(k) > kTable.size())
    throw Error("deviation", "no deviation");
  const DeviationInfo& info = kTable[static_cast<size_t>(k) - 1];
  if (info.kind != k) throw Error("deviation", "table out of order");  // caught by tests
  return info;
}

Deviation parse_deviation(std::string_view s) {
  const size_t at = s.find('@');
  const std::string_view name = s.substr(0, at);
  for (const DeviationInfo& info : kTable) {
    if (info.name != name) continue;
    // A layer-scoped kind without @L: the caller picks the layer (judge_matrix's choice).
    Deviation d{info.kind, info.layer_scoped ? Deviation::kChosenLayer : 0};
    if (at != std::string_view::npos) {
      if (!info.layer_scoped)
        throw Error("deviation", std::string(name) + " changes every layer: it takes no @layer");
      const std::string layer(s.substr(at + 1));
      size_t used = 0;
      try {
        d.layer = std::stoll(layer, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != layer.size() || layer.empty() || d.layer < 0)
        throw Error("deviation", "'" + std::string(s) + "': the layer must be an integer >= 0");
    }
    return d;
  }
  std::string names;
  for (const DeviationInfo& info : kTable)
    names += (names.empty() ? "" : ", ") + std::string(info.name);
  throw Error("deviation", "unknown deviation '" + std::string(name) + "' (" + names + ")");
}

std::string to_string(const Deviation& d) {
  if (!d.any()) return "none";
  const DeviationInfo& info = deviation_info(d.kind);
  return std::string(info.name) + (info.layer_scoped && d.layer != Deviation::kChosenLayer
                                       ? "@" + std::to_string(d.layer)
                                       : "");
}

std::string expected_first_point(const Deviation& d) {
  if (!d.any()) return "";
  const DeviationInfo& info = deviation_info(d.kind);
  if (info.first_point.empty()) return "";
  return point_of(layer_prefix(info.layer_scoped ? d.layer : 0), info.first_point);
}

}  // namespace qparity::reference
