#include "schemes/description/modelopt_config.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/error.h"
#include "core/safetensors/language_model_names.h"
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

// One ModelOpt quant_algo as a point (vLLM's ModelOpt configs; docs/MODELOPT.md):
//   FP8: per-tensor e4m3 weights, static per-tensor inputs;
//   FP8_PER_CHANNEL_PER_TOKEN: per-channel weights, dynamic per-token inputs;
//   FP8_PB_WO: 128x128 block weights, inputs not quantized (ModelOpt's
//     FP8_2D_BLOCKWISE_WEIGHT_ONLY config; vLLM quantizes them 1x128 dynamically: the vllm
//     dialect does too, fp8_block.h);
//   MXFP8: e4m3 weights with E8M0 scales per 32, inputs MXFP8 dynamic (ModelOptMxFp8LinearMethod);
//   NVFP4 / W4A16_NVFP4: e2m1 in 16-blocks, inputs NVFP4 (W4A4) or not quantized.
SchemeId scheme_of_modelopt_algo(const std::string& algo, const std::string& where) {
  if (algo == "FP8") return SchemeId{SchemeKind::kFp8Tensor, 0};
  if (algo == "FP8_PER_CHANNEL_PER_TOKEN") return SchemeId{SchemeKind::kFp8Channel, 0};
  if (algo == "FP8_PB_WO") {
    SchemeId s{SchemeKind::kFp8Block, 0};
    s.weight_only = true;
    return s;
  }
  if (algo == "MXFP8") return SchemeId{SchemeKind::kMxfp8, 0};
  if (algo == "NVFP4" || algo == "W4A16_NVFP4") {
    SchemeId s{SchemeKind::kNvfp4, 0};
    s.weight_only = algo == "W4A16_NVFP4";
    return s;
  }
  throw Error(where, "'" + algo +
                         "' is not implemented (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8, "
                         "NVFP4, W4A16_NVFP4 and MIXED_PRECISION of them are; the AWQ algorithms "
                         "W4A8_AWQ / W4A16_AWQ are not read yet)");
}

std::string modelopt_algo_rule(const std::string& a) {
  if (a == "NVFP4" || a == "W4A16_NVFP4")
    return "quant_algo " + a +
           ": weight U8 e2m1 pairs, weight_scale e4m3 per 16, weight_scale_2 (and input_scale) F32 "
           "multipliers amax / 2688: w = e2m1 * s * ws2";
  if (a == "FP8_PER_CHANNEL_PER_TOKEN")
    return "quant_algo FP8_PER_CHANNEL_PER_TOKEN: e4m3 weights, F32 weight_scale [N] (amax / 448 "
           "per row), inputs quantized per token at run time";
  if (a == "FP8_PB_WO")
    return "quant_algo FP8_PB_WO: e4m3 weights, F32 weight_scale [N/128, 1, K/128, 1] per "
           "128x128 tile; inputs unquantized (ModelOpt), quantized 1x128 dynamically by vLLM "
           "(the vllm dialect)";
  if (a == "MXFP8")
    return "quant_algo MXFP8: e4m3 weights, U8 E8M0 weight_scale [N, K/32]; inputs MXFP8 per 32 "
           "at run time";
  return "quant_algo FP8: per-tensor e4m3 weights, F32 weight_scale and static input_scale "
         "(amax / 448), 0-dim; fused shards keep their own scales";
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
  if (!kv.empty() && kv != "FP8")
    throw Error(key(hf_form ? "kv_cache_quant_algo" : "kv_cache_scheme"),
                "'" + kv + "' is not implemented (an FP8 KV cache is)");
  const bool mixed = algo == "MIXED_PRECISION";
  if (!algo.empty() && !mixed) scheme_of_modelopt_algo(algo, key("quant_algo"));

  // MIXED_PRECISION: quantized_layers maps module names to their own algorithm (vLLM
  // ModelOptMixedPrecisionConfig: a listed module takes its entry's quant_algo, a module not
  // listed stays unquantized, exclude_modules wins over both).
  std::map<std::string, std::pair<std::string, std::string>> per_layer;  // name -> (algo, key)
  if (mixed) {
    const Json& ql = require_key(q, "quantized_layers", qw);
    require_object(ql, key("quantized_layers"));
    if (ql.empty())
      throw Error(key("quantized_layers"),
                  "MIXED_PRECISION needs a non-empty quantized_layers mapping (vLLM raises the "
                  "same)");
    for (const auto& [name, info] : ql.items()) {
      const std::string k = key("quantized_layers." + name);
      require_object(info, k);
      const std::string a = upper(as_string(require_key(info, "quant_algo", k), k));
      scheme_of_modelopt_algo(a, key("quantized_layers." + name + ".quant_algo"));
      if (auto g = opt_int(info, "group_size", k);
          g && (a == "NVFP4" || a == "W4A16_NVFP4") && *g != kModelOptNvfp4Group)
        throw Error(key("quantized_layers." + name + ".group_size"),
                    std::to_string(*g) + " is not implemented (NVFP4 blocks are 16)");
      per_layer[name] = {a, "quantized_layers." + name};
    }
  }

  std::vector<std::string> exclude;
  std::string exclude_key = hf_form ? "exclude_modules" : "ignore";
  if (auto it = q.find(exclude_key); it != q.end() && !it->is_null())
    exclude = module_name_list(*it, key(exclude_key));
  std::vector<bool> used(exclude.size(), false);
  std::set<std::string> matched_layers;
  std::set<std::string> algos_used;
  if (!algo.empty()) {
    if (!mixed && (algo == "NVFP4" || algo == "W4A16_NVFP4"))
      if (auto g = opt_int(q, "group_size", qw); g && *g != kModelOptNvfp4Group)
        throw Error(key("group_size"), std::to_string(*g) +
                                           " is not implemented (NVFP4 blocks "
                                           "are 16)");
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
      std::string a = algo, why_key = "quant_algo";
      if (mixed) {
        // The module's checkpoint name (an image-text model's language model under
        // model.language_model.*), then qparity's, as vLLM tries both spellings.
        const std::string hf = language_model_checkpoint_name(cfg, m.prefix);
        auto it = per_layer.find(hf);
        if (it == per_layer.end()) it = per_layer.find(m.prefix);
        // An expert linear under its stack's entry ("model.layers.0.mlp.experts": vLLM looks the
        // fused-MoE layer up by that prefix).
        if (it == per_layer.end() && m.in_expert_stack()) {
          it = per_layer.find(language_model_checkpoint_name(cfg, m.stack));
          if (it == per_layer.end()) it = per_layer.find(m.stack);
        }
        if (it == per_layer.end()) {
          e.why.note = "not in quantized_layers";
          continue;
        }
        matched_layers.insert(it->first);
        a = it->second.first;
        why_key = it->second.second;
      }
      if (m.kind == LinearKind::kLmHead || m.kind == LinearKind::kRouter) {
        if (mixed)
          throw Error(key(why_key), m.prefix +
                                        ": a quantized lm_head or MoE router is not read (ModelOpt "
                                        "leaves them unquantized by default)");
        e.why.note = "never quantized by ModelOpt's export";
        continue;
      }
      const SchemeId scheme = scheme_of_modelopt_algo(a, key(why_key));
      const ImpliedArgs args = implied_args(scheme);
      e.scheme = scheme;
      e.weights = args.weights;
      e.input_activations = args.input_activations;
      e.format = "modelopt";
      e.source_type = a;
      e.why.key = why_key;
      e.why.note = "quantized";
      algos_used.insert(a);
    }
    if (mixed)
      for (const auto& [name, info] : per_layer)
        if (!matched_layers.count(name))
          plan.add_warning(key("quantized_layers." + name) +
                           ": names no linear of the model (vLLM leaves it unused too)");
    for (const std::string& a : mixed ? algos_used : std::set<std::string>{algo})
      plan.add_rule(modelopt_algo_rule(a));
    if (mixed)
      plan.add_rule(
          "quant_algo MIXED_PRECISION: each module's quant_algo from quantized_layers "
          "(by checkpoint name); modules not listed stay unquantized");
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
  static const std::set<std::string> known_q = {
      "quant_algo", "kv_cache_quant_algo", "exclude_modules", "group_size", "quantized_layers"};
  static const std::set<std::string> known_c = {
      "quant_method", "quant_algo",          "ignore",     "kv_cache_scheme", "config_groups",
      "producer",     "quantization_status", "group_size", "quantized_layers"};
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
