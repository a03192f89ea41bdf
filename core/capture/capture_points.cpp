#include "core/capture/capture_points.h"

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "core/error.h"

namespace qparity {

namespace {

constexpr int64_t kMaxLayers = 1024;

}  // namespace

std::vector<std::string> layer_capture_points(int64_t layer, const LayerShape& shape) {
  using namespace point;
  std::vector<std::string_view> suffixes = {kInputNorm};
  if (shape.linear_attention) {
    suffixes.insert(suffixes.end(),
                    {kLinearAttnQkvz, kLinearAttnBa, kLinearAttnConv, kLinearAttnBeta,
                     kLinearAttnDecay, kLinearAttnCore, kLinearAttnState, kLinearAttnNorm});
  } else {
    suffixes.push_back(kAttnQkv);
    if (shape.qk_norm) suffixes.insert(suffixes.end(), {kAttnQNorm, kAttnKNorm});
    suffixes.insert(suffixes.end(), {kAttnRopeQ, kAttnRopeK});
    if (shape.quantized_kv_cache) suffixes.insert(suffixes.end(), {kAttnKCache, kAttnVCache});
    suffixes.push_back(kAttnCore);
    if (shape.attn_gate) suffixes.push_back(kAttnGated);
  }
  suffixes.insert(suffixes.end(), {kAttnOut, kPostAttnNorm});
  if (shape.moe)
    suffixes.insert(suffixes.end(),
                    {kMoeRouterLogits, kMoeTopkIds, kMoeTopkWeights, kMoeExpertOut, kMoeOut});
  else
    suffixes.insert(suffixes.end(), {kMlpGateUp, kMlpAct, kMlpOut});
  suffixes.push_back(kResidual);
  const std::string prefix = layer_prefix(layer);
  std::vector<std::string> out;
  for (const auto s : suffixes)
    out.push_back(point_of(prefix, s));
  return out;
}

std::string layer_prefix(int64_t layer) {
  return "layers." + std::to_string(layer);
}

std::string point_of(const std::string& prefix, std::string_view suffix) {
  std::string out = prefix;
  out += '.';
  out += suffix;
  return out;
}

LayerShape layer_shape(const ModelConfig& cfg, int64_t layer, bool quantized_kv_cache) {
  LayerShape s;
  s.linear_attention = cfg.is_linear_attention_layer(layer);
  s.qk_norm = cfg.has_qk_norm && !s.linear_attention;
  s.moe = cfg.is_moe_layer(layer);
  s.quantized_kv_cache = quantized_kv_cache && !s.linear_attention;
  s.attn_gate = cfg.attn_output_gate && !s.linear_attention;
  return s;
}

std::vector<std::string> model_capture_points(const ModelConfig& cfg, bool quantized_kv_cache) {
  std::vector<std::string> out = points_before_layers();
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (auto& p : layer_capture_points(l, layer_shape(cfg, l, quantized_kv_cache)))
      out.push_back(std::move(p));
  for (const auto& p : points_after_layers())
    out.push_back(p);
  return out;
}

void check_capture_globs(const std::string& capture, const std::vector<std::string>& points) {
  std::stringstream ss(capture);
  std::string glob;
  bool any = false;
  while (std::getline(ss, glob, ',')) {
    if (glob.empty()) continue;
    any = true;
    bool hit = false;
    for (const auto& p : points)
      hit = hit || fnmatch(glob.c_str(), p.c_str(), 0) == 0;
    if (!hit) {
      std::string some;
      for (size_t i = 0; i < points.size() && i < 4; ++i)
        some += (i ? ", " : "") + points[i];
      throw Error("--capture " + capture,
                  "'" + glob + "' matches no capture point of this model (" +
                      std::to_string(points.size()) + " points: " + some + ", ..., " +
                      (points.empty() ? std::string() : points.back()) + ")");
    }
  }
  if (!any) throw Error("--capture", "is empty: give capture-point globs, e.g. '*'");
}

const std::vector<std::string>& all_layer_point_suffixes() {
  using namespace point;
  const auto codes = [](std::string_view linear, std::string_view leaf) {
    return point_of(std::string(linear), leaf);
  };
  static const std::vector<std::string> all = {
      std::string(kInputNorm),       codes(kQkvProj, kXValues),     codes(kQkvProj, kXScales),
      std::string(kAttnQkv),         std::string(kAttnQNorm),       std::string(kAttnKNorm),
      std::string(kAttnRopeQ),       std::string(kAttnRopeK),       std::string(kAttnKCache),
      std::string(kAttnVCache),      std::string(kAttnCore),        std::string(kAttnGated),
      std::string(kLinearAttnQkvz),  std::string(kLinearAttnBa),    std::string(kLinearAttnConv),
      std::string(kLinearAttnBeta),  std::string(kLinearAttnDecay), std::string(kLinearAttnCore),
      std::string(kLinearAttnState), std::string(kLinearAttnNorm),  codes(kOProj, kXValues),
      codes(kOProj, kXScales),       std::string(kAttnOut),         std::string(kPostAttnNorm),
      codes(kGateUpProj, kXValues),  codes(kGateUpProj, kXScales),  std::string(kMlpGateUp),
      std::string(kMlpAct),          codes(kDownProj, kXValues),    codes(kDownProj, kXScales),
      std::string(kMlpOut),          std::string(kMoeRouterLogits), std::string(kMoeTopkIds),
      std::string(kMoeTopkWeights),  std::string(kMoeExpertOut),    std::string(kMoeOut),
      std::string(kResidual)};
  return all;
}

int64_t capture_point_width(const ModelConfig& cfg, const std::string& point) {
  using namespace point;
  if (point == kEmbed || point == kFinalNorm) return cfg.hidden;
  if (point == kLogits) return cfg.vocab;
  const int64_t layer = point_layer(point);
  if (layer < 0 || layer >= cfg.num_layers) return -1;
  const std::string s = point_suffix(point);
  const int64_t h = cfg.hidden, q = cfg.q_size(), kv = cfg.kv_size();
  const int64_t i = cfg.intermediate, k = cfg.num_experts_per_tok;
  if (s == kInputNorm || s == kAttnOut || s == kPostAttnNorm || s == kMlpOut || s == kMoeOut ||
      s == kResidual)
    return h;
  const LinearAttentionDims& la = cfg.linear;
  if (s == kAttnQkv) return cfg.q_proj_size() + 2 * kv;
  if (s == kAttnQNorm || s == kAttnRopeQ || s == kAttnCore || s == kAttnGated) return q;
  if (s == kLinearAttnQkvz) return la.conv_dim() + la.value_dim();
  if (s == kLinearAttnBa) return 2 * la.num_value_heads;
  if (s == kLinearAttnConv) return la.conv_dim();
  if (s == kLinearAttnBeta || s == kLinearAttnDecay) return la.num_value_heads;
  if (s == kLinearAttnCore || s == kLinearAttnNorm) return la.value_dim();
  if (s == kLinearAttnState) return la.state_size();
  if (s == kAttnKNorm || s == kAttnRopeK || s == kAttnKCache || s == kAttnVCache) return kv;
  if (s == kMlpGateUp) return 2 * i;
  if (s == kMlpAct) return i;
  if (s == kMoeRouterLogits) return cfg.num_experts;
  if (s == kMoeTopkIds || s == kMoeTopkWeights) return k;
  if (s == kMoeExpertOut) return k * h;
  if (s == point_of(std::string(kQkvProj), kXValues) ||
      s == point_of(std::string(kGateUpProj), kXValues))
    return h;
  if (s == point_of(std::string(kOProj), kXValues)) return q;
  if (s == point_of(std::string(kDownProj), kXValues)) return i;
  return -1;
}

std::string auto_capture(const ModelConfig& cfg, int64_t tokens, int64_t bytes_per_value,
                         uint64_t limit, uint64_t* full_bytes) {
  uint64_t full = 0;
  for (const std::string& p : model_capture_points(cfg))
    full += static_cast<uint64_t>(std::max<int64_t>(capture_point_width(cfg, p), 0)) *
            static_cast<uint64_t>(tokens) * static_cast<uint64_t>(bytes_per_value);
  if (full_bytes) *full_bytes = full;
  return full <= limit ? "*" : std::string(kBoundaryCapture);
}

const std::vector<std::string>& activation_code_linears() {
  static const std::vector<std::string> v = {
      std::string(point::kQkvProj), std::string(point::kOProj), std::string(point::kGateUpProj),
      std::string(point::kDownProj)};
  return v;
}

bool is_activation_code_point(const std::string& point) {
  const std::string s = point_suffix(point);
  for (const auto& l : activation_code_linears())
    if (s == point_of(l, point::kXValues) || s == point_of(l, point::kXScales)) return true;
  return false;
}

const std::vector<std::string>& points_before_layers() {
  static const std::vector<std::string> v = {std::string(point::kEmbed)};
  return v;
}

const std::vector<std::string>& points_after_layers() {
  static const std::vector<std::string> v = {std::string(point::kFinalNorm),
                                             std::string(point::kLogits)};
  return v;
}

int64_t point_layer(const std::string& point) {
  if (point.rfind("layers.", 0) != 0) return -1;
  const char* first = point.data() + 7;
  const char* last = point.data() + point.size();
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(first, last, layer);
  if (ec != std::errc() || end == first || end == last || *end != '.') return -1;
  return layer;
}

std::string point_suffix(const std::string& point) {
  if (point_layer(point) < 0) return "";
  return point.substr(point.find('.', 7) + 1);
}

std::string layer_input_point(int64_t layer) {
  return layer == 0 ? std::string(point::kEmbed)
                    : point_of(layer_prefix(layer - 1), point::kResidual);
}

bool glob_names_a_capture_point(const std::string& glob) {
  const auto matches = [&](const std::string& name) {
    return fnmatch(glob.c_str(), name.c_str(), 0) == 0;
  };
  for (const auto* list : {&points_before_layers(), &points_after_layers()})
    for (const auto& n : *list)
      if (matches(n)) return true;
  for (int64_t l = 0; l < kMaxLayers; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    for (const auto& s : all_layer_point_suffixes())
      if (matches(prefix + s)) return true;
  }
  return false;
}

}  // namespace qparity
