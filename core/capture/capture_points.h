#pragma once
// The capture-point catalog: the names every engine gives the tensors it can dump, in execution
// order (ARCHITECTURE.md, golden/SCHEMA.md). One list, so that policies, compare and bisect
// agree on what a name means and where it sits in the data flow.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/model_config.h"

namespace qparity {

// The catalog's names, one constant each. Both engines and compare spell a point through these
// (point_of(layer_prefix(i), point::kAttnQkv)), so a misspelt name is a compile error and a
// rename happens here only.
namespace point {
inline constexpr std::string_view kEmbed = "embed";
inline constexpr std::string_view kFinalNorm = "final_norm";
inline constexpr std::string_view kLogits = "logits";
// Suffixes of a decoder layer's points, "layers.<i>.<suffix>".
inline constexpr std::string_view kInputNorm = "input_norm";
inline constexpr std::string_view kAttnQkv = "attn.qkv";
inline constexpr std::string_view kAttnQNorm = "attn.q_norm";
inline constexpr std::string_view kAttnKNorm = "attn.k_norm";
inline constexpr std::string_view kAttnRopeQ = "attn.rope_q";
inline constexpr std::string_view kAttnRopeK = "attn.rope_k";
inline constexpr std::string_view kAttnKCache = "attn.k_cache";
inline constexpr std::string_view kAttnVCache = "attn.v_cache";
inline constexpr std::string_view kAttnCore = "attn.core";
// Qwen3.5's gated attention: attn.core * sigmoid(gate), what o_proj reads.
inline constexpr std::string_view kAttnGated = "attn.gated";
// The token mixer's output, whichever mixer the layer has (softmax or linear attention).

inline constexpr std::string_view kAttnOut = "attn.out";
// Qwen3.5's Gated DeltaNet layers (gated_delta_net.h), in execution order: the fused input
// projections [q | k | v | z] and [b | a], the causal conv + SiLU output [q | k | v], the gates
// beta = sigmoid(b) and the log-space decay g, the delta rule's output per value head, the
// recurrent state after each token ([value heads, key dim, value dim] flattened), and the gated
// norm's output (out_proj's input). The mixer's output is attn.out.
inline constexpr std::string_view kLinearAttnQkvz = "linear_attn.qkvz";
inline constexpr std::string_view kLinearAttnBa = "linear_attn.ba";
inline constexpr std::string_view kLinearAttnConv = "linear_attn.conv";
inline constexpr std::string_view kLinearAttnBeta = "linear_attn.beta";
inline constexpr std::string_view kLinearAttnDecay = "linear_attn.decay";
inline constexpr std::string_view kLinearAttnCore = "linear_attn.core";
inline constexpr std::string_view kLinearAttnState = "linear_attn.state";
inline constexpr std::string_view kLinearAttnNorm = "linear_attn.norm";
inline constexpr std::string_view kPostAttnNorm = "post_attn_norm";
inline constexpr std::string_view kMlpGateUp = "mlp.gate_up";
inline constexpr std::string_view kMlpAct = "mlp.act";
inline constexpr std::string_view kMlpOut = "mlp.out";
inline constexpr std::string_view kMoeRouterLogits = "moe.router_logits";
inline constexpr std::string_view kMoeTopkIds = "moe.topk_ids";
inline constexpr std::string_view kMoeTopkWeights = "moe.topk_weights";
inline constexpr std::string_view kMoeExpertOut = "moe.expert_out";
inline constexpr std::string_view kMoeOut = "moe.out";
// The residual stream a layer leaves to the next (an image prompt's deepstack features, added
// to the image rows after the first layers, included).
inline constexpr std::string_view kResidual = "residual";
// Activation-quantized linears (engine layers) whose codes a dump may hold, and the two leaves
// under each: "layers.<i>.attn.qkv_proj.x_values" (the codes fed to the GEMM) and ".x_scales".
inline constexpr std::string_view kQkvProj = "attn.qkv_proj";
inline constexpr std::string_view kOProj = "attn.o_proj";
inline constexpr std::string_view kGateUpProj = "mlp.gate_up_proj";
inline constexpr std::string_view kDownProj = "mlp.down_proj";
inline constexpr std::string_view kExpertsW13 = "moe.experts.w13";
inline constexpr std::string_view kExpertsW2 = "moe.experts.w2";
inline constexpr std::string_view kXValues = "x_values";
inline constexpr std::string_view kXScales = "x_scales";
}  // namespace point

// "layers.<layer>"
std::string layer_prefix(int64_t layer);
// "<prefix>.<suffix>": a layer's point (point_of(layer_prefix(3), point::kAttnCore)) or a leaf
// under one (point_of(qkv_proj_name, point::kXValues)).
std::string point_of(const std::string& prefix, std::string_view suffix);

// What a decoder layer holds: Qwen3 normalizes q and k per head; a MoE layer routes its MLP.
struct LayerShape {
  bool qk_norm = false;
  bool moe = false;
  bool quantized_kv_cache = false;  // attn.k_cache / attn.v_cache: what the cache holds
  bool linear_attention = false;    // a Gated DeltaNet layer (Qwen3.5): linear_attn.* points
  bool attn_gate = false;           // gated attention (Qwen3.5): attn.gated
};
// The shape of decoder layer `layer` of `cfg`.
LayerShape layer_shape(const ModelConfig& cfg, int64_t layer, bool quantized_kv_cache = false);

// The points of one decoder layer, "layers.<i>.<suffix>", in execution order.
std::vector<std::string> layer_capture_points(int64_t layer, const LayerShape& shape);

// Every suffix a layer point can have (dense and MoE, with and without q/k norm, and the KV-cache
// points of a quantized cache), in execution order of a layer that had them all.
const std::vector<std::string>& all_layer_point_suffixes();

// The linears whose activation codes a dump may hold (activation-quantized schemes), as
// "layers.<i>.<name>.x_values" (the codes fed to the GEMM, [T, K]) and ".x_scales" (their scale
// grid): "attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj".
const std::vector<std::string>& activation_code_linears();
// Whether a point is one of those (compared exactly: a dialect fixes every bit).
bool is_activation_code_point(const std::string& point);

// Every capture point of a model, in execution order: what a full dump of it holds (with the
// KV-cache points when its cache is quantized).
std::vector<std::string> model_capture_points(const ModelConfig& cfg,
                                              bool quantized_kv_cache = false);

// Each comma-separated glob of a --capture value must name at least one of `points` (a model's
// points): otherwise an error naming the glob and a few of the names it could have meant.
void check_capture_globs(const std::string& capture, const std::vector<std::string>& points);

// Values per token of a capture point of `cfg` (logits: vocab; layers.<i>.attn.qkv: q + 2 kv;
// ...x_values: the linear's input features); -1 where the width depends on the scheme
// (x_scales) or the name is not a point.
int64_t capture_point_width(const ModelConfig& cfg, const std::string& point);

// The --capture default ("auto"): every point ("*") while a golden of all of them for `tokens`
// tokens at `bytes_per_value` stays within `limit` bytes, else the layer boundaries (embed, each
// layer's attn.out and residual, final_norm: enough for bisect to find the layer and re-run
// it from its input; the logits are in every golden's outputs anyway). `full_bytes` receives the
// size of everything.
std::string auto_capture(const ModelConfig& cfg, int64_t tokens, int64_t bytes_per_value,
                         uint64_t limit, uint64_t* full_bytes = nullptr);
inline constexpr std::string_view kBoundaryCapture =
    "embed,layers.*.attn.out,layers.*.residual,final_norm";

// The points outside the decoder layers: before them ("embed") and after them ("final_norm",
// "logits").
const std::vector<std::string>& points_before_layers();
const std::vector<std::string>& points_after_layers();

// The layer a point belongs to ("layers.3.attn.qkv" -> 3), -1 for embed / final_norm / logits,
// and the point's suffix within the layer ("attn.qkv"; empty outside a layer).
int64_t point_layer(const std::string& point);
std::string point_suffix(const std::string& point);

// The input of a layer as a dump holds it: "embed" for layer 0, else "layers.<i-1>.residual".
std::string layer_input_point(int64_t layer);

// Whether a glob (fnmatch) can name any capture point of any model up to 1024 layers: a glob that
// cannot (a typo: "layer.0.attn.qkv", "*.attn.qvk") gates nothing and is refused by the policy
// parser.
bool glob_names_a_capture_point(const std::string& glob);

}  // namespace qparity
