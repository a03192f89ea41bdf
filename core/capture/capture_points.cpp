#include "core/capture/capture_points.h"

#include <fnmatch.h>

#include <charconv>
#include <sstream>

#include "core/error.h"

namespace qparity {

namespace {

constexpr int64_t kMaxLayers = 1024;

}  // namespace

std::vector<std::string> layer_capture_points(int64_t layer, const LayerShape& shape) {
  std::vector<std::string> suffixes = {"input_norm", "attn.qkv"};
  if (shape.qk_norm) suffixes.insert(suffixes.end(), {"attn.q_norm", "attn.k_norm"});
  suffixes.insert(suffixes.end(),
                  {"attn.rope_q", "attn.rope_k", "attn.core", "attn.out", "post_attn_norm"});
  if (shape.moe)
    suffixes.insert(suffixes.end(), {"moe.router_logits", "moe.topk_ids", "moe.topk_weights",
                                     "moe.expert_out", "moe.out"});
  else
    suffixes.insert(suffixes.end(), {"mlp.gate_up", "mlp.act", "mlp.out"});
  suffixes.push_back("residual");
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  for (auto& s : suffixes)
    s = prefix + s;
  return suffixes;
}

std::vector<std::string> model_capture_points(const ModelConfig& cfg) {
  std::vector<std::string> out = points_before_layers();
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (auto& p : layer_capture_points(l, {cfg.has_qk_norm, cfg.is_moe_layer(l)}))
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
  static const std::vector<std::string> all = {"input_norm",
                                               "attn.qkv_proj.x_values",
                                               "attn.qkv_proj.x_scales",
                                               "attn.qkv",
                                               "attn.q_norm",
                                               "attn.k_norm",
                                               "attn.rope_q",
                                               "attn.rope_k",
                                               "attn.k_cache",
                                               "attn.v_cache",
                                               "attn.core",
                                               "attn.o_proj.x_values",
                                               "attn.o_proj.x_scales",
                                               "attn.out",
                                               "post_attn_norm",
                                               "mlp.gate_up_proj.x_values",
                                               "mlp.gate_up_proj.x_scales",
                                               "mlp.gate_up",
                                               "mlp.act",
                                               "mlp.down_proj.x_values",
                                               "mlp.down_proj.x_scales",
                                               "mlp.out",
                                               "moe.router_logits",
                                               "moe.topk_ids",
                                               "moe.topk_weights",
                                               "moe.expert_out",
                                               "moe.out",
                                               "residual"};
  return all;
}

const std::vector<std::string>& activation_code_linears() {
  static const std::vector<std::string> v = {"attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj",
                                             "mlp.down_proj"};
  return v;
}

bool is_activation_code_point(const std::string& point) {
  const std::string s = point_suffix(point);
  for (const auto& l : activation_code_linears())
    if (s == l + ".x_values" || s == l + ".x_scales") return true;
  return false;
}

const std::vector<std::string>& points_before_layers() {
  static const std::vector<std::string> v = {"embed"};
  return v;
}

const std::vector<std::string>& points_after_layers() {
  static const std::vector<std::string> v = {"final_norm", "logits"};
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
  return layer == 0 ? "embed" : "layers." + std::to_string(layer - 1) + ".residual";
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
