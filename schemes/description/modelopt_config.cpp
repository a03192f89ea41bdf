#include "schemes/description/modelopt_config.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "schemes/description/config_keys.h"

namespace qparity {

namespace {

constexpr int64_t kModelOptNvfp4Group = 16;

std::string upper(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// vLLM's is_layer_excluded, in its order: the exact name, the legacy substring test, fnmatch.
bool excluded_by(const std::string& entry, const std::string& name) {
  if (entry == name || name.find(entry) != std::string::npos) return true;
  return fnmatch(entry.c_str(), name.c_str(), 0) == 0;
}

}  // namespace

bool is_modelopt_hf_quant_config(const Json& qc) {
  return qc.is_object() && qc.contains("quantization") && qc.at("quantization").is_object() &&
         !qc.contains("quant_method");
}

QuantPlan plan_from_modelopt_config(const ModelConfig& cfg, const Json& qc,
                                    const std::string& where) {
  require_object(qc, where);
  const bool hf_form = qc.contains("quantization");
  const std::string qw =
      hf_form ? key_where(where, "quantization") : key_where(where, "quantization_config");
  const Json& q = hf_form ? qc.at("quantization") : qc;
  require_object(q, qw);
  auto key = [&](const std::string& k) {
    return key_where(where, std::string(hf_form ? "quantization." : "quantization_config.") + k);
  };

  QuantPlan plan(cfg, Provenance{PlanSource::kModelOpt, where, "", "", "", ""});
  plan.set_source(PlanSource::kModelOpt, where);
  std::string version = "unknown";
  if (auto it = qc.find("producer"); it != qc.end() && it->is_object()) {
    if (auto n = opt_string(*it, "name", key_where(where, "producer")); n && *n != "modelopt")
      throw Error(key_where(where, "producer.name"),
                  "'" + *n + "' is not modelopt; this reader follows ModelOpt's export");
    version = opt_string(*it, "version", key_where(where, "producer")).value_or("unknown");
  }
  plan.add_rule(
      "ModelOpt " + version + (hf_form ? " hf_quant_config.json" : " quantization_config") +
      ": exclude entries match by name, substring, then fnmatch (vLLM is_layer_excluded)");

  const auto algo_v = opt_string(q, "quant_algo", qw);
  const std::string algo = algo_v ? upper(*algo_v) : "";
  // The KV cache: kv_cache_quant_algo (hf form) or kv_cache_scheme (config.json form).
  std::string kv;
  if (hf_form) {
    if (auto k = opt_string(q, "kv_cache_quant_algo", qw)) kv = upper(*k);
  } else if (auto it = q.find("kv_cache_scheme"); it != q.end() && !it->is_null()) {
    if (it->is_string())
      kv = upper(it->get<std::string>());
    else if (it->is_object() && it->value("type", "") == "float" && it->value("num_bits", 0) == 8)
      kv = "FP8";
    else
      throw Error(key("kv_cache_scheme"), it->dump() + " is not an FP8 KV cache scheme");
  }
  if (algo.empty() && kv.empty()) throw Error(key("quant_algo"), "missing (and no KV algorithm)");
  const bool nvfp4 = algo == "NVFP4" || algo == "W4A16_NVFP4";
  if (!algo.empty() && algo != "FP8" && algo != "FP8_PER_CHANNEL_PER_TOKEN" && !nvfp4)
    throw Error(key("quant_algo"),
                "'" + algo +
                    "' is not implemented (FP8, FP8_PER_CHANNEL_PER_TOKEN, NVFP4 and W4A16_NVFP4 "
                    "are; FP8_PB_WO, MXFP8, the AWQ algorithms and MIXED_PRECISION are not read "
                    "yet)");
  if (!kv.empty() && kv != "FP8")
    throw Error(key(hf_form ? "kv_cache_quant_algo" : "kv_cache_scheme"),
                "'" + kv + "' is not implemented (an FP8 KV cache is)");

  std::vector<std::string> exclude;
  std::string exclude_key = hf_form ? "exclude_modules" : "ignore";
  if (auto it = q.find(exclude_key); it != q.end() && !it->is_null())
    exclude = module_name_list(*it, key(exclude_key));
  std::vector<bool> used(exclude.size(), false);
  if (!algo.empty()) {
    // FP8: per-tensor weights, static per-tensor inputs; FP8_PER_CHANNEL_PER_TOKEN: per-channel
    // F32 weight_scale [N], inputs dynamic per token (vLLM ModelOptFp8PcPtLinearMethod).
    const bool pc = algo == "FP8_PER_CHANNEL_PER_TOKEN";
    // NVFP4: e2m1 weights in 16-blocks with a weight_scale_2 multiplier, inputs NVFP4 per
    // 16-block with the static input_scale (W4A4); W4A16_NVFP4: weights only.
    if (nvfp4) {
      if (auto g = opt_int(q, "group_size", qw); g && *g != kModelOptNvfp4Group)
        throw Error(key("group_size"), std::to_string(*g) +
                                           " is not implemented (NVFP4 blocks "
                                           "are 16)");
    }
    SchemeId scheme{pc      ? SchemeKind::kFp8Channel
                    : nvfp4 ? SchemeKind::kNvfp4
                            : SchemeKind::kFp8Tensor,
                    0};
    scheme.weight_only = algo == "W4A16_NVFP4";
    const ImpliedArgs args = implied_args(scheme);
    for (const LinearModule& m : plan.modules().linears()) {
      PlanEntry& e = plan.mutable_entry(m.prefix);
      size_t hit = exclude.size();
      for (size_t i = 0; i < exclude.size(); ++i)
        if (excluded_by(exclude[i], m.prefix)) {
          used[i] = true;
          if (hit == exclude.size()) hit = i;
        }
      if (hit < exclude.size()) {
        e.why.target = exclude[hit];
        e.why.key = std::string(hf_form ? "quantization." : "quantization_config.") + exclude_key +
                    "[" + std::to_string(hit) + "]";
        e.why.note = "excluded";
        continue;
      }
      if (m.kind == LinearKind::kLmHead || m.kind == LinearKind::kRouter) {
        e.why.note = "never quantized by ModelOpt's export";
        continue;
      }
      e.scheme = scheme;
      e.weights = args.weights;
      e.input_activations = args.input_activations;
      e.format = "modelopt";
      e.source_type = algo;
      e.why.key = "quant_algo";
      e.why.note = "quantized";
    }
    plan.add_rule(nvfp4 ? "quant_algo " + algo +
                              ": weight U8 e2m1 pairs, weight_scale e4m3 per 16, weight_scale_2 "
                              "(and input_scale) F32 multipliers amax / 2688: w = e2m1 * s * ws2"
                  : pc ? std::string("quant_algo FP8_PER_CHANNEL_PER_TOKEN: e4m3 weights, F32 "
                                     "weight_scale [N] (amax / 448 per row), inputs quantized per "
                                     "token at run time")
                       : std::string("quant_algo FP8: per-tensor e4m3 weights, F32 weight_scale "
                                     "and static input_scale (amax / 448), 0-dim; fused shards "
                                     "keep their own scales"));
  }
  if (kv == "FP8") {
    QuantArgs a = *implied_args(SchemeId{SchemeKind::kKvFp8, 0}).kv_cache;
    for (const AttentionModule& at : plan.modules().attentions()) {
      PlanEntry& e = plan.mutable_entry(at.prefix);
      e.scheme = SchemeId{SchemeKind::kKvFp8, 0};
      e.kv_cache = a;
      e.format = "modelopt";
      e.why.key = hf_form ? "kv_cache_quant_algo" : "kv_cache_scheme";
      e.why.note = "FP8 KV cache";
    }
    plan.add_rule("kv FP8: <attn>.k_proj.k_scale / v_proj.v_scale, F32 amax / 448");
  }
  for (size_t i = 0; i < exclude.size(); ++i)
    if (!used[i] && !plan.modules().contains(exclude[i]))
      plan.add_warning(key(exclude_key + "[" + std::to_string(i) + "]") + ": '" + exclude[i] +
                       "' matches no linear of the model");
  static const std::set<std::string> known_q = {"quant_algo", "kv_cache_quant_algo",
                                                "exclude_modules", "group_size"};
  static const std::set<std::string> known_c = {"quant_method",        "quant_algo",    "ignore",
                                                "kv_cache_scheme",     "config_groups", "producer",
                                                "quantization_status", "group_size"};
  if (hf_form) {
    warn_unknown_keys(plan, q, qw, known_q);
    warn_unknown_keys(plan, qc, where, {"producer", "quantization"});
  } else {
    warn_unknown_keys(plan, qc, qw, known_c);
  }
  plan.finalize();
  return plan;
}

}  // namespace qparity
