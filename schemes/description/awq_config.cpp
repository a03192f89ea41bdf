#include "schemes/description/awq_config.h"

#include <set>

#include "core/error.h"
#include "schemes/description/config_keys.h"

namespace qparity {

namespace {

const char* const kQc = "quantization_config";

// The value of the first of `names` present (vLLM's get_from_keys), with the key it came from.
std::pair<const Json*, std::string> first_of(const Json& qc,
                                             std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto it = qc.find(n); it != qc.end() && !it->is_null()) return {&*it, n};
  return {nullptr, ""};
}

}  // namespace

QuantPlan plan_from_awq_config(const ModelConfig& cfg, const Json& qc, const std::string& where) {
  const std::string qw = key_where(where, kQc);
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };
  require_object(qc, qw);

  const auto [bits_j, bits_k] = first_of(qc, {"w_bit", "bits"});
  if (!bits_j) throw Error(key("bits"), "missing (an AWQ config names bits or w_bit)");
  const int64_t bits = as_int(*bits_j, key(bits_k));
  if (bits != 4)
    throw Error(key(bits_k), std::to_string(bits) +
                                 " is not implemented (AWQ's GEMM layout packs 4-bit codes; "
                                 "vLLM's AWQ reads 4 bits only)");
  const auto [group_j, group_k] = first_of(qc, {"q_group_size", "group_size"});
  if (!group_j) throw Error(key("group_size"), "missing (an AWQ config names group_size)");
  const int64_t group = as_int(*group_j, key(group_k));
  if (group != -1 && group <= 0)
    throw Error(key(group_k), std::to_string(group) + " must be -1 or > 0");
  if (!opt_bool(qc, "zero_point", qw).value_or(true))
    throw Error(key("zero_point"),
                "false is not implemented (AutoAWQ's GEMM packing stores zero points; a "
                "checkpoint without them has no layout vLLM reads)");
  const std::string version = opt_string(qc, "version", qw).value_or("gemm");
  std::string lower = version;
  for (char& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower != "gemm")
    throw Error(key("version"), "'" + version +
                                    "' is not implemented (the GEMM layout is; GEMV and the "
                                    "kernel-specific layouts store other tensors)");
  if (auto b = opt_string(qc, "backend", qw); b && *b != "autoawq")
    throw Error(key("backend"), "'" + *b + "' is not implemented (AutoAWQ's packing is)");

  IntWeightPoint p;
  p.bits = 4;
  p.group = group == -1 ? IntWeightPoint::kChannel : group;
  p.symmetric = false;
  const SchemeId scheme{.kind = SchemeKind::kPackedInt, .int_weights = p};

  std::vector<std::string> skip;
  if (auto it = qc.find("modules_to_not_convert"); it != qc.end() && !it->is_null())
    skip = module_name_list(*it, key("modules_to_not_convert"));

  QuantPlan plan(cfg, Provenance{PlanSource::kAwq, where, "", "", "", ""});
  plan.set_source(PlanSource::kAwq, where);
  plan.add_rule(
      "AWQ version gemm: qweight [K, N/8] and qzeros [G, N/8] hold nibbles in "
      "AWQ_ORDER [0, 2, 4, 6, 1, 3, 5, 7]; w = (u - z) * scales, zeros unshifted");
  plan.add_rule(
      "modules_to_not_convert: substring match on module names (vLLM "
      "is_layer_skipped_awq)");
  std::vector<bool> used(skip.size(), false);
  for (const LinearModule& m : plan.modules().linears()) {
    PlanEntry& e = plan.mutable_entry(m.prefix);
    if (m.kind == LinearKind::kLmHead || m.kind == LinearKind::kRouter) {
      e.why.note = "never quantized by AWQ";
      continue;
    }
    size_t hit = skip.size();
    for (size_t i = 0; i < skip.size(); ++i)
      if (m.prefix.find(skip[i]) != std::string::npos) {
        used[i] = true;
        if (hit == skip.size()) hit = i;
      }
    if (hit < skip.size()) {
      e.why.target = skip[hit];
      e.why.key = std::string(kQc) + ".modules_to_not_convert[" + std::to_string(hit) + "]";
      e.why.note = "not converted";
      continue;
    }
    e.scheme = scheme;
    e.weights = packed_int_args(p);
    e.format = "awq";
    e.source_type = "awq";
    e.why.key = std::string(kQc) + ".quant_method";
    e.why.note = "quantized";
  }
  for (size_t i = 0; i < skip.size(); ++i)
    if (!used[i])
      plan.add_warning(key("modules_to_not_convert[" + std::to_string(i) + "]") + ": '" + skip[i] +
                       "' matches no linear of the model");
  static const std::set<std::string> known = {"quant_method",
                                              "bits",
                                              "w_bit",
                                              "group_size",
                                              "q_group_size",
                                              "zero_point",
                                              "version",
                                              "backend",
                                              "modules_to_not_convert",
                                              "do_fuse",
                                              "fuse_max_seq_len",
                                              "modules_to_fuse",
                                              "exllama_config"};
  warn_unknown_keys(plan, qc, qw, known);
  plan.finalize();
  return plan;
}

}  // namespace qparity
