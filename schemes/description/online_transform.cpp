#include "schemes/description/online_transform.h"

#include <map>

#include "core/error.h"
#include "core/safetensors/language_model_names.h"
#include "schemes/description/config_keys.h"
#include "schemes/description/ct_pattern.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

std::string to_string(TransformType t) {
  switch (t) {
    case TransformType::kHadamard:
      return "hadamard";
    case TransformType::kRandomHadamard:
      return "random-hadamard";
    case TransformType::kRandomMatrix:
      return "random-matrix";
  }
  return "?";
}

std::string to_string(TransformLocation l) {
  switch (l) {
    case TransformLocation::kInput:
      return "input";
    case TransformLocation::kWeightInput:
      return "weight_input";
    case TransformLocation::kWeightOutput:
      return "weight_output";
    case TransformLocation::kOutput:
      return "output";
    case TransformLocation::kQAttn:
      return "q_attn";
    case TransformLocation::kKCache:
      return "k_cache";
  }
  return "?";
}

bool is_online(TransformLocation l) {
  return l != TransformLocation::kWeightInput && l != TransformLocation::kWeightOutput;
}

bool TransformGroup::online() const {
  for (const TransformApply& a : apply)
    if (is_online(a.location)) return true;
  return false;
}

std::string TransformGroup::key(const std::string& sub) const {
  return key_where(where, path + sub);
}

std::string OnlineTransform::stem() const {
  return group + "_" + to_string(location);
}

bool OnlineTransform::operator==(const OnlineTransform& o) const {
  return group == o.group && type == o.type && location == o.location && inverse == o.inverse &&
         randomize == o.randomize && size == o.size && precision == o.precision;
}

namespace {

TransformType parse_type(const std::string& s, const std::string& where) {
  if (s == "hadamard") return TransformType::kHadamard;
  if (s == "random-hadamard") return TransformType::kRandomHadamard;
  if (s == "random-matrix") return TransformType::kRandomMatrix;
  throw Error(where, "unknown transform type '" + s +
                         "' (compressed-tensors registers hadamard, random-hadamard, "
                         "random-matrix)");
}

TransformLocation parse_location(const std::string& s, const std::string& where) {
  for (TransformLocation l : {TransformLocation::kInput, TransformLocation::kWeightInput,
                              TransformLocation::kWeightOutput, TransformLocation::kOutput,
                              TransformLocation::kQAttn, TransformLocation::kKCache})
    if (s == to_string(l)) return l;
  throw Error(where, "unknown location '" + s +
                         "' (known: input, weight_input, weight_output, output, q_attn, k_cache)");
}

std::vector<std::string> string_or_list(const Json& j, const std::string& where) {
  if (j.is_string()) return {j.get<std::string>()};  // TransformArgs.wrap_singleton
  return as_string_list(j, where);
}

}  // namespace

std::vector<TransformGroup> parse_transform_config(const Json& j, const std::string& where) {
  const std::string base = "quantization_config.transform_config";
  auto key = [&](const std::string& path) { return key_where(where, base + "." + path); };
  require_object(j, key_where(where, base));
  std::vector<TransformGroup> groups;
  const auto cg = j.find("config_groups");
  if (cg == j.end() || cg->is_null()) return groups;
  require_object(*cg, key("config_groups"));
  for (const auto& [name, g] : cg->items()) {
    const std::string gpath = "config_groups." + name;
    const std::string gk = key(gpath);
    require_object(g, gk);
    TransformGroup t;
    t.name = name;
    t.where = where;
    t.path = base + "." + gpath;
    t.type = parse_type(opt_string(g, "type", gk).value_or("hadamard"), key(gpath + ".type"));
    t.randomize = opt_bool(g, "randomize", gk).value_or(false);
    if (opt_bool(g, "requires_grad", gk).value_or(false))
      throw Error(key(gpath + ".requires_grad"),
                  "true: a training-time parametrization (the weights are stored as "
                  "parametrizations.weight.original, not fused); not a deployable checkpoint");
    if (auto hd = g.find("head_dim"); hd != g.end() && !hd->is_null()) {
      t.head_dim = opt_int(g, "head_dim", gk);
      if (*t.head_dim <= 0)
        throw Error(key(gpath + ".head_dim"),
                    "must be positive, got " + std::to_string(*t.head_dim));
    }
    if (auto p = opt_string(g, "precision", gk)) {
      // TorchDtype serializes as "torch.float32" or "float32".
      t.precision = p->rfind("torch.", 0) == 0 ? p->substr(6) : *p;
      if (t.precision != "float32" && t.precision != "float64" && t.precision != "bfloat16" &&
          t.precision != "float16")
        throw Error(key(gpath + ".precision"), "unknown precision '" + *p + "'");
    }
    const Json& apply = require_key(g, "apply", gk);
    if (!apply.is_array()) throw Error(key(gpath + ".apply"), "expected a list");
    for (size_t i = 0; i < apply.size(); ++i) {
      const std::string apath = gpath + ".apply[" + std::to_string(i) + "]";
      const std::string ak = key(apath);
      require_object(apply[i], ak);
      TransformApply a;
      a.location = parse_location(as_string(require_key(apply[i], "location", ak), ak),
                                  key(apath + ".location"));
      a.targets = string_or_list(require_key(apply[i], "targets", ak), key(apath + ".targets"));
      if (auto ig = apply[i].find("ignore"); ig != apply[i].end() && !ig->is_null())
        a.ignore = string_or_list(*ig, key(apath + ".ignore"));
      a.inverse = opt_bool(apply[i], "inverse", ak).value_or(false);
      if (a.location == TransformLocation::kQAttn || a.location == TransformLocation::kKCache)
        throw Error(key(apath + ".location"),
                    "'" + to_string(a.location) + "': an online " + to_string(t.type) +
                        " rotation of the attention's " +
                        (a.location == TransformLocation::kQAttn ? "queries" : "cached keys") +
                        " (SpinQuant R3) is not applied by qparity (vLLM refuses it as well: "
                        "'Cannot apply q_attn transform'); the linear locations input / output "
                        "and the fused weight_input / weight_output are");
      t.apply.push_back(std::move(a));
    }
    groups.push_back(std::move(t));
  }
  return groups;
}

std::vector<std::string> transform_linears(const TransformGroup& g, size_t index,
                                           const ModelConfig& cfg, const ModuleNames& mods,
                                           std::vector<std::string>* others) {
  const TransformApply& a = g.apply.at(index);
  const std::string apath = ".apply[" + std::to_string(index) + "]";
  const std::string ak = g.key(apath);
  std::vector<Pattern> targets, ignores;
  for (size_t t = 0; t < a.targets.size(); ++t)
    targets.emplace_back(a.targets[t], g.key(apath + ".targets[" + std::to_string(t) + "]"));
  for (size_t t = 0; t < a.ignore.size(); ++t)
    ignores.emplace_back(a.ignore[t], g.key(apath + ".ignore[" + std::to_string(t) + "]"));
  auto hit = [&](const std::string& prefix, const std::string& cls) {
    const std::string hf = language_model_checkpoint_name(cfg, prefix);
    return any_matches(targets, hf, cls) && !any_matches(ignores, hf, cls);
  };
  // Modules other than linears: an online rotation there (the embedding's output, an attention
  // module's input) has no place in either engine.
  auto other = [&](const std::string& prefix, const std::string& cls) {
    if (!hit(prefix, cls)) return;
    if (is_online(a.location))
      throw Error(ak, "an online " + to_string(a.location) + " transform on " + prefix + " (" +
                          cls +
                          "), which is not a linear: qparity applies online transforms to "
                          "linears only (as vLLM does)");
    if (others) others->push_back(prefix + " (" + cls + ")");
  };
  for (const auto& s : mods.expert_stacks())
    other(s.prefix, s.class_name);
  for (const auto& at : mods.attentions())
    other(at.prefix, at.class_name);
  for (const auto& o : mods.others())
    other(o.prefix, o.class_name);
  std::vector<std::string> out;
  for (const LinearModule& m : mods.linears())
    if (hit(m.prefix, m.class_name)) out.push_back(m.prefix);
  return out;
}

void apply_transform_config(const std::vector<TransformGroup>& groups, const ModelConfig& cfg,
                            QuantPlan& plan) {
  const ModuleNames& mods = plan.modules();
  // Checkpoint module names that hold more than one of qparity's linears (ChatGLM2's
  // query_key_value): an output transform there spans the fused rows, which the per-partition
  // method cannot express.
  std::map<std::string, int> hf_count;
  for (const LinearModule& m : mods.linears())
    ++hf_count[language_model_checkpoint_name(cfg, m.prefix)];
  for (const TransformGroup& g : groups) {
    if (!g.online()) {
      plan.add_warning(g.key() + " (" + to_string(g.type) +
                       "): offline locations only (weight_input / weight_output): compressed-"
                       "tensors fused it into the stored weights, so nothing is applied at run "
                       "time (as vLLM does)");
      continue;
    }
    for (size_t i = 0; i < g.apply.size(); ++i) {
      const TransformApply& a = g.apply[i];
      if (!is_online(a.location)) continue;
      const std::string ak = g.key(".apply[" + std::to_string(i) + "]");
      const std::vector<std::string> linears = transform_linears(g, i, cfg, mods);
      for (const std::string& prefix : linears) {
        const LinearModule& m = *mods.find_linear(prefix);
        const std::string hf = language_model_checkpoint_name(cfg, m.prefix);
        OnlineTransform t;
        t.group = g.name;
        t.type = g.type;
        t.location = a.location;
        t.inverse = a.inverse;
        t.randomize = g.randomize;
        t.precision = g.precision;
        t.key = ak;
        const int64_t full =
            a.location == TransformLocation::kInput ? m.in_features : m.out_features;
        t.size = g.head_dim.value_or(full);
        if (full % t.size != 0)
          throw Error(ak, "head_dim " + std::to_string(t.size) + " does not divide " + m.prefix +
                              "'s " + (a.location == TransformLocation::kInput ? "in" : "out") +
                              "_features " + std::to_string(full));
        if (a.location == TransformLocation::kOutput && hf_count[hf] > 1)
          throw Error(ak, "an output transform on " + hf +
                              ", a fused checkpoint module: per-partition output rotations are "
                              "what vLLM and qparity run, and this module's rows are not split "
                              "by the transform");
        PlanEntry& e = plan.mutable_entry(m.prefix);
        for (const OnlineTransform& o : e.transforms)
          if (o.location == t.location)
            throw Error(ak, m.prefix + " has a second " + to_string(t.location) +
                                " transform (first from " + o.key +
                                "): one per location, as vLLM requires");
        e.transforms.push_back(std::move(t));
      }
      if (linears.empty())
        plan.add_warning(ak + ": the online " + to_string(a.location) +
                         " transform matches no linear of the model");
    }
  }
}

}  // namespace qparity
