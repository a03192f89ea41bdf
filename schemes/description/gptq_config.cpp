#include "schemes/description/gptq_config.h"

#include <set>

#include "core/error.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/config_keys.h"

namespace qparity {

namespace {

const char* const kQc = "quantization_config";

// One GPTQ point as the config (or a dynamic override) gives it.
struct GptqPoint {
  int bits = 4;
  int64_t group_size = 128;
  bool desc_act = false;
  bool sym = true;
};

void check_point(const GptqPoint& p, const std::string& where) {
  if (p.bits != 2 && p.bits != 3 && p.bits != 4 && p.bits != 8)
    throw Error(where,
                "bits " + std::to_string(p.bits) + " is not a GPTQ width vLLM reads (2, 3, 4, 8)");
  if (p.group_size != -1 && p.group_size <= 0)
    throw Error(where, "group_size " + std::to_string(p.group_size) + " must be -1 or > 0");
}

SchemeId scheme_of(const GptqPoint& p) {
  IntWeightPoint ip;
  ip.bits = p.bits;
  ip.group = p.group_size == -1 ? IntWeightPoint::kChannel : p.group_size;
  ip.symmetric = p.sym;
  // One group: the permutation changes nothing, and vLLM ignores g_idx (has_g_idx needs both).
  ip.actorder = p.desc_act && p.group_size != -1;
  return SchemeId{.kind = SchemeKind::kPackedInt, .int_weights = ip};
}

// Reads the point fields present in `j` over `base`; other keys are an Error naming them (an
// override we cannot honour would change the math).
GptqPoint read_point(const Json& j, GptqPoint base, const std::string& where, bool override_only) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string k = it.key();
    const std::string kw = key_where(where, k);
    if (k == "bits") {
      base.bits = static_cast<int>(as_int(*it, kw));
    } else if (k == "group_size") {
      base.group_size = as_int(*it, kw);
    } else if (k == "desc_act") {
      base.desc_act = as_bool(*it, kw);
    } else if (k == "sym") {
      base.sym = as_bool(*it, kw);
    } else if (override_only && k != "damp_percent" && k != "damp_auto_increment" &&
               k != "static_groups" && k != "true_sequential" && k != "mse" &&
               k != "act_group_aware") {
      // Calibration-only fields change how the codes were searched, not what they mean.
      throw Error(kw, "a dynamic override of '" + k +
                          "' is not implemented (bits, group_size, desc_act, sym are)");
    }
  }
  check_point(base, where);
  return base;
}

}  // namespace

QuantPlan plan_from_gptq_config(const ModelConfig& cfg, const Json& qc, const std::string& where) {
  const std::string qw = key_where(where, kQc);
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };
  require_object(qc, qw);
  GptqPoint base;
  if (!qc.contains("bits")) throw Error(key("bits"), "missing (a GPTQ config names its bits)");
  for (const char* k : {"bits", "group_size", "desc_act", "sym"})
    if (auto it = qc.find(k); it != qc.end() && it->is_null())
      throw Error(key(k), "is null; a GPTQ config gives it a value");
  base = read_point(qc, base, qw, false);

  QuantPlan plan(cfg, Provenance{PlanSource::kGptq, where, "", "", "", ""});
  plan.set_source(PlanSource::kGptq, where);

  // checkpoint_format (AutoGPTQ, Optimum) or format (GPTQModel >= 2): how qzeros are stored.
  std::string fmt = "gptq", fmt_key = "checkpoint_format";
  for (const char* k : {"checkpoint_format", "format"}) {
    auto f = opt_string(qc, k, qw);
    if (!f) continue;
    if (fmt_key != k && qc.contains("checkpoint_format") && *f != fmt)
      throw Error(key(k), "'" + *f + "' contradicts checkpoint_format '" + fmt + "'");
    fmt = *f;
    fmt_key = k;
  }
  if (fmt != "gptq" && fmt != "gptq_v2")
    throw Error(key(fmt_key), "'" + fmt +
                                  "' is not implemented (gptq and gptq_v2 are: the tensors of a "
                                  "repacked layout such as marlin or bitblas are not GPTQ's)");
  plan.add_rule(fmt == "gptq"
                    ? "GPTQ checkpoint_format gptq (v1): qzeros hold z - 1; read as stored + 1"
                    : "GPTQ checkpoint_format gptq_v2: qzeros hold z");
  if (opt_bool(qc, "is_marlin_format", qw).value_or(false))
    throw Error(key("is_marlin_format"),
                "true is not implemented (AutoGPTQ's Marlin-repacked tensors are not GPTQ's "
                "qweight / qzeros layout)");
  if (auto it = qc.find("rotation");
      it != qc.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
    throw Error(key("rotation"), it->dump() +
                                     " is not implemented (GPTQModel's rotation changes what the "
                                     "weights mean; the config does not say how to undo it)");
  if (auto pd = opt_string(qc, "pack_dtype", qw); pd && *pd != "int32" && *pd != "torch.int32")
    throw Error(key("pack_dtype"), "'" + *pd + "' is not implemented (vLLM reads int32 words)");
  plan.add_rule(
      "GPTQ packing: qweight [K*b/32, N] and qzeros [G, N*b/32] as little-endian b-bit "
      "streams in int32 words; w = (u - z) * scales[g_idx[k]]");
  if (base.desc_act && base.group_size != -1)
    plan.add_rule(
        "desc_act: the g_idx act-order groups are read and checked (group_size columns "
        "each)");

  // Which decoder linears: modules_in_block_to_quantize (substrings), minus dynamic "-:".
  std::vector<std::string> in_block;
  if (auto it = qc.find("modules_in_block_to_quantize"); it != qc.end() && !it->is_null()) {
    const std::string k = key("modules_in_block_to_quantize");
    if (!it->is_array()) throw Error(k, "expected a list of lists of module names");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& inner = (*it)[i];
      const auto names = inner.is_array() ? as_string_list(inner, k + "[" + std::to_string(i) + "]")
                                          : std::vector<std::string>{as_string(inner, k)};
      in_block.insert(in_block.end(), names.begin(), names.end());
    }
  }
  struct Dyn {
    bool skip;
    std::string pattern;  // "re:" form for ct_name_matches
    std::string key;
    GptqPoint point;
  };
  std::vector<Dyn> dynamic;
  if (auto it = qc.find("dynamic"); it != qc.end() && !it->is_null()) {
    const std::string k = key("dynamic");
    require_object(*it, k);
    for (auto d = it->begin(); d != it->end(); ++d) {
      std::string pat = d.key();
      const std::string dk = k + "[\"" + pat + "\"]";
      bool skip = false;
      if (pat.rfind("-:", 0) == 0) {
        skip = true;
        pat = pat.substr(2);
      } else if (pat.rfind("+:", 0) == 0) {
        pat = pat.substr(2);
      }
      require_object(*d, dk);
      GptqPoint p = skip ? base : read_point(*d, base, dk, true);
      dynamic.push_back({skip, "re:" + pat, dk, p});
    }
  }
  const bool lm_head = opt_bool(qc, "lm_head", qw).value_or(false);

  std::vector<bool> block_used(in_block.size(), false);
  std::vector<bool> dyn_used(dynamic.size(), false);
  for (const LinearModule& m : plan.modules().linears()) {
    PlanEntry& e = plan.mutable_entry(m.prefix);
    if (m.kind == LinearKind::kRouter) {
      e.why.note = "MoE routers are never GPTQ-quantized";
      continue;
    }
    if (m.kind == LinearKind::kLmHead && !lm_head) {
      e.why.key = std::string(kQc) + ".lm_head";
      e.why.note = "lm_head false (or absent)";
      continue;
    }
    if (!in_block.empty() && m.kind != LinearKind::kLmHead) {
      size_t hit = in_block.size();
      for (size_t i = 0; i < in_block.size(); ++i)
        if (m.prefix.find(in_block[i]) != std::string::npos) {
          block_used[i] = true;
          if (hit == in_block.size()) hit = i;
        }
      if (hit == in_block.size()) {
        e.why.key = std::string(kQc) + ".modules_in_block_to_quantize";
        e.why.note = "not listed";
        continue;
      }
    }
    GptqPoint p = base;
    std::string decided = std::string(kQc) + ".quant_method";
    bool skipped = false;
    for (size_t i = 0; i < dynamic.size(); ++i) {
      if (!ct_name_matches(dynamic[i].pattern, m.prefix, dynamic[i].key)) continue;
      dyn_used[i] = true;
      decided = dynamic[i].key.substr(dynamic[i].key.find(kQc));
      if (dynamic[i].skip)
        skipped = true;
      else
        p = dynamic[i].point;
      break;
    }
    if (skipped) {
      e.why.key = decided;
      e.why.note = "dynamic -: not quantized";
      continue;
    }
    const SchemeId s = scheme_of(p);
    e.scheme = s;
    e.weights = packed_int_args(s.int_weights);
    e.format = fmt;
    e.source_type = "gptq";
    e.why.key = decided;
    e.why.note = "quantized";
  }
  for (size_t i = 0; i < in_block.size(); ++i)
    if (!block_used[i])
      plan.add_warning(key("modules_in_block_to_quantize") + ": '" + in_block[i] +
                       "' matches no linear of the model");
  for (size_t i = 0; i < dynamic.size(); ++i)
    if (!dyn_used[i]) plan.add_warning(dynamic[i].key + ": matches no linear of the model");

  // Read above, or calibration / tooling fields of AutoGPTQ, GPTQModel and Optimum that do not
  // change the stored tensors' meaning.
  static const std::set<std::string> known = {"quant_method",
                                              "bits",
                                              "group_size",
                                              "desc_act",
                                              "sym",
                                              "checkpoint_format",
                                              "format",
                                              "pack_dtype",
                                              "modules_in_block_to_quantize",
                                              "dynamic",
                                              "lm_head",
                                              "damp_percent",
                                              "damp_auto_increment",
                                              "true_sequential",
                                              "static_groups",
                                              "model_name_or_path",
                                              "model_file_base_name",
                                              "meta",
                                              "quantizer",
                                              "tokenizer",
                                              "dataset",
                                              "use_exllama",
                                              "exllama_config",
                                              "max_input_length",
                                              "use_cuda_fp16",
                                              "cache_block_outside",
                                              "batch_size",
                                              "pad_token_id",
                                              "module_name_preceding_first_block",
                                              "backend",
                                              "disable_exllama",
                                              "use_marlin",
                                              "mse",
                                              "act_group_aware",
                                              "v2",
                                              "v2_alpha",
                                              "hyb_act",
                                              "offload_to_disk",
                                              "offload_to_disk_path",
                                              "rotation",
                                              "is_marlin_format",
                                              "block_name_to_quantize"};
  warn_unknown_keys(plan, qc, qw, known);
  plan.finalize();
  return plan;
}

}  // namespace qparity
