#include "schemes/description/gpt_oss_mxfp4_config.h"

#include <regex>
#include <set>

#include "core/error.h"
#include "schemes/description/config_keys.h"

namespace qparity {

namespace {

const char* const kQc = "quantization_config";

// transformers quantizers should_convert_module: re.match(f"{key}\\.", name) or
// re.match(key, name) or name.endswith(key).
bool not_converted_by(const std::string& pattern, const std::string& name, const std::string& key) {
  if (name.size() >= pattern.size() &&
      name.compare(name.size() - pattern.size(), pattern.size(), pattern) == 0)
    return true;
  try {
    const std::regex re(pattern);
    return std::regex_search(name, re, std::regex_constants::match_continuous);
  } catch (const std::regex_error& e) {
    throw Error(key, "'" + pattern + "' is not a regular expression (" + e.what() + ")");
  }
}

}  // namespace

QuantPlan plan_from_mxfp4_config(const ModelConfig& cfg, const Json& qc, const std::string& where) {
  const std::string qw = key_where(where, kQc);
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };
  if (!cfg.is_moe())
    throw Error(key("quant_method"),
                "'mxfp4' quantizes MoE expert stacks only, and " + cfg.arch_name + " has none");
  std::vector<std::string> skip;
  if (auto it = qc.find("modules_to_not_convert"); it != qc.end() && !it->is_null())
    skip = module_name_list(*it, key("modules_to_not_convert"));

  const SchemeId scheme{.kind = SchemeKind::kMxfp4, .weight_only = true};
  const ImpliedArgs args = implied_args(scheme);
  QuantPlan plan(cfg, Provenance{PlanSource::kMxfp4, where, "", "", "", ""});
  plan.set_source(PlanSource::kMxfp4, where);
  plan.add_rule(
      "quant_method mxfp4 (gpt-oss): expert stacks e2m1 + E8M0 per 32 inputs, weight-only, "
      "from *_blocks [E, N, K/32, 16] (element 2j in the low nibble) and *_scales [E, N, K/32]; "
      "gate/up rows interleaved (even gate, odd up)");
  plan.add_rule(
      "quant_method mxfp4: every other linear unquantized (vLLM Mxfp4Config: LinearBase -> "
      "UnquantizedLinearMethod)");
  for (const LinearModule& m : plan.modules().linears()) {
    PlanEntry& e = plan.mutable_entry(m.prefix);
    if (m.stack.empty()) {
      e.why.key = std::string(kQc) + ".quant_method";
      e.why.note = "not an expert stack: unquantized under mxfp4";
      continue;
    }
    for (size_t i = 0; i < skip.size(); ++i) {
      const std::string k = key("modules_to_not_convert[" + std::to_string(i) + "]");
      if (not_converted_by(skip[i], m.stack, k) || not_converted_by(skip[i], m.prefix, k))
        throw Error(k, "'" + skip[i] + "' names the expert stack " + m.stack +
                           ": transformers would keep it unquantized, vLLM (which ignores "
                           "modules_to_not_convert) reads it as MXFP4");
    }
    e.scheme = scheme;
    e.weights = args.weights;
    e.input_activations = args.input_activations;
    e.format = "mxfp4-pack-quantized";
    e.source_type = "mxfp4";
    e.why.key = std::string(kQc) + ".quant_method";
    e.why.note = "expert stack: MXFP4 weight-only";
  }
  static const std::set<std::string> known = {"quant_method", "modules_to_not_convert",
                                              "dequantize"};
  warn_unknown_keys(plan, qc, qw, known);
  plan.finalize();
  return plan;
}

}  // namespace qparity
