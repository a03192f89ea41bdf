#include "schemes/description/quant_plan.h"

#include <algorithm>

#include "core/error.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/msmodelslim_config.h"

namespace qparity {

namespace {

namespace fs = std::filesystem;

QuantArgs args(const char* json) {
  return parse_quant_args(Json::parse(json), "implied args");
}

bool same_quantization(const PlanEntry& a, const PlanEntry& b) {
  return a.scheme == b.scheme && a.weights == b.weights &&
         a.input_activations == b.input_activations && a.format == b.format &&
         a.sparsity == b.sparsity;
}

std::string describe_entry(const PlanEntry& e) {
  std::string s = e.scheme_string();
  if (e.weights) s += " [weights " + describe(*e.weights);
  if (e.input_activations)
    s += std::string(e.weights ? "; " : " [") + "inputs " + describe(*e.input_activations);
  if (e.weights || e.input_activations) s += "]";
  if (!e.sparsity.empty()) s += " (" + e.sparsity + ")";
  for (const OnlineTransform& t : e.transforms)
    s += " +" + to_string(t.location) + " " + to_string(t.type) + (t.inverse ? "^T" : "");
  return s;
}

Json provenance_json(const Provenance& p) {
  Json j = {{"source", std::string(to_string(p.source))}};
  if (!p.file.empty()) j["file"] = p.file;
  if (!p.group.empty()) j["group"] = p.group;
  if (!p.target.empty()) j["target"] = p.target;
  if (!p.key.empty()) j["key"] = p.key;
  if (!p.note.empty()) j["note"] = p.note;
  return j;
}

}  // namespace

std::string_view to_string(ModuleRole r) {
  switch (r) {
    case ModuleRole::kLinear:
      return "linear";
    case ModuleRole::kExpertStack:
      return "expert-stack";
    case ModuleRole::kKvCache:
      return "kv-cache";
    case ModuleRole::kNorm:
      return "norm";
  }
  return "?";
}

std::string_view to_string(PlanSource s) {
  switch (s) {
    case PlanSource::kDefault:
      return "default";
    case PlanSource::kOverride:
      return "override";
    case PlanSource::kMsModelSlim:
      return "msmodelslim";
    case PlanSource::kCompressedTensors:
      return "compressed-tensors";
    case PlanSource::kFp8:
      return "fp8";
    case PlanSource::kGptq:
      return "gptq";
    case PlanSource::kAwq:
      return "awq";
    case PlanSource::kModelOpt:
      return "modelopt";
    case PlanSource::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

bool PlanEntry::quantized() const {
  if (!scheme) return false;
  return scheme->kind != SchemeKind::kBf16 && scheme->kind != SchemeKind::kKvBf16;
}

std::string PlanEntry::scheme_string() const {
  return scheme ? to_string(*scheme) : "none";
}

ImpliedArgs implied_args(const SchemeId& s) {
  ImpliedArgs a;
  switch (s.kind) {
    case SchemeKind::kBf16:
    case SchemeKind::kKvBf16:
    case SchemeKind::kSmoothQuant:
      break;
    case SchemeKind::kW8A16Channel:
      a.weights = args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":false})");
      break;
    case SchemeKind::kW8A16Group:
      a.weights = parse_quant_args(Json{{"num_bits", 8},
                                        {"type", "int"},
                                        {"strategy", "group"},
                                        {"group_size", s.group_size},
                                        {"symmetric", false}},
                                   "implied args");
      break;
    case SchemeKind::kW8A8Static:
    case SchemeKind::kW8A8S:
      a.weights = args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":true})");
      a.input_activations =
          args(R"({"num_bits":8,"type":"int","strategy":"tensor","symmetric":false})");
      break;
    case SchemeKind::kW8A8Int8:
      a.weights = w8a8_int8_weight_args(s.int8_act);
      a.input_activations = w8a8_int8_input_args(s.int8_act);
      break;
    case SchemeKind::kW4A8Dyn:
      a.weights = args(R"({"num_bits":4,"type":"int","strategy":"channel","symmetric":true})");
      a.input_activations =
          args(R"({"num_bits":8,"type":"int","strategy":"token","symmetric":true,"dynamic":true})");
      break;
    case SchemeKind::kPackedInt:
      a.weights = packed_int_args(s.int_weights);
      break;
    case SchemeKind::kMxint4:
      a.weights = args(
          R"({"num_bits":4,"type":"int","strategy":"group","group_size":32,"symmetric":true})");
      break;
    case SchemeKind::kFp8Tensor:
      a.weights = args(R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true})");
      a.input_activations =
          args(R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true})");
      break;
    case SchemeKind::kFp8Channel:
      a.weights = args(R"({"num_bits":8,"type":"float","strategy":"channel","symmetric":true})");
      a.input_activations = args(
          R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})");
      break;
    case SchemeKind::kFp8Block:
      a.weights = args(
          R"({"num_bits":8,"type":"float","strategy":"block","block_structure":[128,128],"symmetric":true})");
      a.input_activations = args(
          R"({"num_bits":8,"type":"float","strategy":"group","group_size":128,"symmetric":true,"dynamic":true})");
      break;
    case SchemeKind::kNvfp4:
      a.weights = args(
          R"({"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"symmetric":true,"scale_dtype":"torch.float8_e4m3fn"})");
      a.input_activations = args(
          R"({"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"symmetric":true,"dynamic":"local","scale_dtype":"torch.float8_e4m3fn"})");
      break;
    case SchemeKind::kMxfp4:
      a.weights = args(
          R"({"num_bits":4,"type":"float","strategy":"group","group_size":32,"symmetric":true,"scale_dtype":"torch.uint8"})");
      a.input_activations = args(
          R"({"num_bits":4,"type":"float","strategy":"group","group_size":32,"symmetric":true,"dynamic":true,"scale_dtype":"torch.uint8"})");
      break;
    case SchemeKind::kMxfp8:
      a.weights = args(
          R"({"num_bits":8,"type":"float","strategy":"group","group_size":32,"symmetric":true,"scale_dtype":"torch.uint8"})");
      a.input_activations = args(
          R"({"num_bits":8,"type":"float","strategy":"group","group_size":32,"symmetric":true,"dynamic":true,"scale_dtype":"torch.uint8"})");
      break;
    case SchemeKind::kKvInt8:
      a.kv_cache = args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":false})");
      break;
    case SchemeKind::kKvFp8:
      a.kv_cache = args(R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true})");
      break;
  }
  // The A16 points of the fp4 / MX families: weights only.
  if (s.weight_only) a.input_activations.reset();
  if (s.kind == SchemeKind::kPackedInt) a.input_activations = int_weight_input_args(s.int_inputs);
  if (s.kv_per_head)
    a.kv_cache = args(R"({"num_bits":8,"type":"float","strategy":"attn_head","symmetric":true})");
  return a;
}

// ---------------------------------------------------------------------------------------------
// QuantPlan

QuantPlan::QuantPlan(const ModelConfig& cfg, Provenance why)
    : modules_(std::make_shared<const ModuleNames>(cfg)), model_dtype_(cfg.dtype) {
  const ModuleNames& m = *modules_;
  auto add = [&](PlanEntry e) {
    index_.emplace(e.prefix, entries_.size());
    entries_.push_back(std::move(e));
  };
  auto linear_entry = [&](const LinearModule& l) {
    PlanEntry e;
    e.prefix = l.prefix;
    e.role = ModuleRole::kLinear;
    e.scheme = SchemeId{SchemeKind::kBf16, 0};
    e.why = why;
    e.layer = l.layer;
    e.expert = l.expert;
    e.shard = l.shard;
    e.stack = l.stack;
    e.out_features = l.out_features;
    e.in_features = l.in_features;
    return e;
  };
  // Interleave the module lists into execution order; ModuleNames keeps each list in that order.
  size_t li = 0, ni = 0;
  auto next_linear_in = [&](int64_t layer) {
    return li < m.linears().size() && m.linears()[li].layer == layer;
  };
  auto take_linears_until = [&](int64_t layer, LinearKind stop_after) {
    while (next_linear_in(layer)) {
      const LinearModule& l = m.linears()[li++];
      add(linear_entry(l));
      if (l.kind == stop_after) return;
    }
  };
  auto take_norm = [&](NormKind kind) {
    while (ni < m.norms().size() && m.norms()[ni].kind != kind)
      ++ni;  // skip q/k norms
    const NormModule& n = m.norms()[ni++];
    PlanEntry e;
    e.prefix = n.prefix;
    e.role = ModuleRole::kNorm;
    e.why = why;
    e.layer = n.layer;
    add(std::move(e));
  };
  size_t si = 0, ai = 0;
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    take_norm(NormKind::kInputLayernorm);
    if (ai < m.attentions().size() && m.attentions()[ai].layer == layer) {
      const AttentionModule& a = m.attentions()[ai++];
      take_linears_until(layer, LinearKind::kVProj);
      PlanEntry kv;
      kv.prefix = a.prefix;
      kv.role = ModuleRole::kKvCache;
      kv.scheme = SchemeId{SchemeKind::kKvBf16, 0};
      kv.why = why;
      kv.layer = a.layer;
      add(std::move(kv));
      take_linears_until(layer, LinearKind::kOProj);
    } else {  // a Gated DeltaNet layer: its projections, no KV cache
      take_linears_until(layer, LinearKind::kLinearAttnOut);
    }
    take_norm(NormKind::kPostAttentionLayernorm);
    if (si < m.expert_stacks().size() && m.expert_stacks()[si].layer == layer) {
      take_linears_until(layer, LinearKind::kRouter);
      const ExpertStack& s = m.expert_stacks()[si++];
      PlanEntry se;
      se.prefix = s.prefix;
      se.role = ModuleRole::kExpertStack;
      se.scheme = SchemeId{SchemeKind::kBf16, 0};
      se.why = why;
      se.layer = s.layer;
      add(std::move(se));
    }
    take_linears_until(layer, LinearKind::kLmHead);  // the rest of the layer's MLP
  }
  take_norm(NormKind::kFinal);
  take_linears_until(-1, LinearKind::kLmHead);
}

const PlanEntry* QuantPlan::find(std::string_view prefix) const {
  auto it = index_.find(std::string(prefix));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const PlanEntry& QuantPlan::method_for(std::string_view prefix) const {
  if (const PlanEntry* e = find(prefix)) return *e;
  throw Error(std::string(prefix), "no such module in the quantization plan of this model");
}

PlanEntry& QuantPlan::mutable_entry(std::string_view prefix) {
  auto it = index_.find(std::string(prefix));
  if (it == index_.end())
    throw Error(std::string(prefix), "no such module in the quantization plan of this model");
  return entries_[it->second];
}

void QuantPlan::set_source(PlanSource s, std::string file) {
  source_ = s;
  source_file_ = std::move(file);
}

void QuantPlan::finalize() {
  // Per-entry rules.
  for (PlanEntry& e : entries_) {
    if (!e.scheme) {
      if (e.role != ModuleRole::kNorm)
        throw Error(e.prefix, "internal: plan entry without a scheme");
      continue;
    }
    const SchemeFamily fam = scheme_family(e.scheme->kind);
    const bool family_ok = (e.role == ModuleRole::kKvCache && fam == SchemeFamily::kKvCache) ||
                           (e.role == ModuleRole::kNorm && fam == SchemeFamily::kTransform) ||
                           ((e.role == ModuleRole::kLinear || e.role == ModuleRole::kExpertStack) &&
                            fam == SchemeFamily::kWeight);
    if (!family_ok)
      throw Error(e.prefix, "scheme " + e.scheme_string() + " (" + std::string(to_string(fam)) +
                                ") cannot apply to a " + std::string(to_string(e.role)) +
                                " module");
    if (e.role != ModuleRole::kLinear) continue;
    const LinearModule* lm = modules_->find_linear(e.prefix);
    const bool in_stack = !e.stack.empty();
    if (e.scheme->kind == SchemeKind::kMxint4 && !in_stack)
      throw Error(e.prefix,
                  "mxint4 applies to MoE expert stacks only (this linear would be "
                  "w4a16-g32)");
    if (e.scheme->kind == SchemeKind::kPackedInt && in_stack &&
        e.scheme->int_weights == IntWeightPoint{})
      throw Error(e.prefix, "internal: an expert linear in the w4a16-g32 format is mxint4");
    if (!e.quantized()) continue;
    if (lm && lm->kind == LinearKind::kRouter)
      throw Error(e.prefix,
                  "the MoE router is never quantized by SGLang or vLLM (they build it "
                  "unquantized); leave it unquantized (compressed-tensors: add "
                  "'re:.*mlp.gate$' to ignore)");
    if (lm && lm->tied)
      throw Error(e.prefix,
                  "tie_word_embeddings is true, so lm_head shares "
                  "model.embed_tokens.weight and cannot carry its own quantized "
                  "weight; leave it unquantized");
    const int64_t g = required_k_multiple(*e.scheme);
    if (g > 0 && e.in_features % g != 0)
      throw Error(e.prefix, e.scheme_string() +
                                " needs in_features (K = " + std::to_string(e.in_features) +
                                ") divisible by " + std::to_string(g));
    if (e.scheme->kind == SchemeKind::kMxint4 && !model_dtype_.empty() &&
        model_dtype_ != "bfloat16")
      throw Error(e.prefix,
                  "mxint4 needs a bfloat16 model (SGLang asserts bf16 parameters), "
                  "the config says " +
                      model_dtype_);
  }

  // Expert stacks: engines fuse all experts and the w1/w3/w2 shards into one [E, ...] stack, so
  // one scheme must cover them (SGLang raises "All MoE projections need to have same
  // quantization scheme").
  for (const ExpertStack& s : modules_->expert_stacks()) {
    const PlanEntry* first = nullptr;
    for (int64_t ex = 0; ex < s.num_experts; ++ex) {
      for (const char* proj : {".gate_proj", ".up_proj", ".down_proj"}) {
        const PlanEntry& e = method_for(s.prefix + "." + std::to_string(ex) + proj);
        if (!first) {
          first = &e;
        } else if (!same_quantization(*first, e)) {
          throw Error(s.prefix,
                      "all experts and their gate/up/down projections must share one "
                      "quantization scheme (engines fuse them into one stack), but " +
                          first->prefix + " is " + describe_entry(*first) + " and " + e.prefix +
                          " is " + describe_entry(e));
        }
      }
    }
    if (!first) continue;
    PlanEntry& se = mutable_entry(s.prefix);
    se.scheme = first->scheme;
    se.weights = first->weights;
    se.input_activations = first->input_activations;
    se.format = first->format;
    se.sparsity = first->sparsity;
    se.source_type = first->source_type;
    se.why = first->why;
  }

  // Engines fuse q/k/v into qkv_proj and gate/up into gate_up_proj and reject differing schemes
  // there (vLLM raises); the reference runs them separately, so this is only a warning.
  auto check_fused = [&](const std::vector<std::string>& names, const std::string& fused) {
    const PlanEntry* a = find(names[0]);
    if (!a) return;
    for (size_t i = 1; i < names.size(); ++i) {
      const PlanEntry* b = find(names[i]);
      if (b && !same_quantization(*a, *b)) {
        add_warning(a->prefix + " is " + describe_entry(*a) + " but " + b->prefix + " is " +
                    describe_entry(*b) + ": an engine that fuses them into " + fused +
                    " rejects this");
        return;
      }
    }
  };
  for (const AttentionModule& a : modules_->attentions())
    check_fused({a.prefix + ".q_proj", a.prefix + ".k_proj", a.prefix + ".v_proj"},
                a.prefix + ".qkv_proj");
  for (const LinearAttentionModule& la : modules_->linear_attentions()) {
    check_fused({la.prefix + ".in_proj_qkv", la.prefix + ".in_proj_z"},
                la.prefix + ".in_proj_qkvz");
    check_fused({la.prefix + ".in_proj_b", la.prefix + ".in_proj_a"}, la.prefix + ".in_proj_ba");
  }
  for (const LinearModule& l : modules_->linears())
    if (l.kind == LinearKind::kGateProj) {
      const std::string mlp = l.prefix.substr(0, l.prefix.rfind('.'));
      check_fused({mlp + ".gate_proj", mlp + ".up_proj"}, mlp + ".gate_up_proj");
    }
}

std::map<std::string, int64_t> QuantPlan::summary() const {
  std::map<std::string, int64_t> out;
  for (const PlanEntry& e : entries_)
    if (e.scheme) ++out[e.scheme_string()];
  return out;
}

Json QuantPlan::to_json() const {
  Json modules = Json::array();
  for (const PlanEntry& e : entries_) {
    Json j = {{"prefix", e.prefix},
              {"role", std::string(to_string(e.role))},
              {"scheme", e.scheme ? Json(e.scheme_string()) : Json(nullptr)},
              {"quantized", e.quantized()},
              {"format", e.format},
              {"decided_by", provenance_json(e.why)}};
    if (!e.sparsity.empty()) j["sparsity"] = e.sparsity;
    for (const OnlineTransform& t : e.transforms)
      j["online_transforms"].push_back({{"group", t.group},
                                        {"type", to_string(t.type)},
                                        {"location", to_string(t.location)},
                                        {"inverse", t.inverse},
                                        {"randomize", t.randomize},
                                        {"size", t.size},
                                        {"precision", t.precision},
                                        {"tensor", e.prefix + "." + t.stem() + ".weight"},
                                        {"key", t.key}});
    if (!e.source_type.empty()) j["source_type"] = e.source_type;
    if (e.weights) j["weights"] = qparity::to_json(*e.weights);
    if (e.input_activations) j["input_activations"] = qparity::to_json(*e.input_activations);
    if (e.kv_cache) j["kv_cache"] = qparity::to_json(*e.kv_cache);
    if (!e.stack.empty()) {
      j["stack"] = e.stack;
      j["expert"] = e.expert;
      j["shard"] = std::string(to_string(e.shard));
    }
    if (e.role == ModuleRole::kLinear) {
      j["out_features"] = e.out_features;
      j["in_features"] = e.in_features;
    }
    modules.push_back(std::move(j));
  }
  return {{"source", std::string(to_string(source_))},
          {"source_file", source_file_},
          {"summary", summary()},
          {"warnings", warnings_},
          {"rules", rules_},
          {"modules", modules}};
}

// ---------------------------------------------------------------------------------------------
// Builders

std::optional<SchemeId> override_scheme_of(const LinearModule& l, const SchemeId& scheme) {
  if (scheme_family(scheme.kind) != SchemeFamily::kWeight) return std::nullopt;
  if (l.kind == LinearKind::kLmHead || l.kind == LinearKind::kRouter) return std::nullopt;
  // Qwen3.5's Gated DeltaNet projections stay unquantized, as llm-compressor's FP8 / NVFP4
  // Qwen3.5 and Qwen3-Next recipes write them (ignore `re:.*linear_attn.*`); a checkpoint whose
  // config quantizes them (AWQ W4A16) is read as its config says.
  switch (l.kind) {
    case LinearKind::kLinearAttnQkv:
    case LinearKind::kLinearAttnZ:
    case LinearKind::kLinearAttnB:
    case LinearKind::kLinearAttnA:
    case LinearKind::kLinearAttnOut:
      return std::nullopt;
    default:
      break;
  }
  SchemeId s = scheme;
  // One checkpoint format, two scheme ids: experts run it as an MxINT4 stack.
  // SGLang runs int4 group-32 symmetric experts as MxInt4; other points stay pack-quantized.
  if (s.kind == SchemeKind::kPackedInt && s.int_weights == IntWeightPoint{} && l.in_expert_stack())
    s = SchemeId{SchemeKind::kMxint4, 0};
  if (s.kind == SchemeKind::kMxint4 && !l.in_expert_stack())
    s = SchemeId{SchemeKind::kPackedInt, 0};
  return s;
}

QuantPlan plan_from_override(const ModelConfig& cfg, const SchemeId& scheme,
                             const std::set<std::string>& unquantized) {
  const std::string id = to_string(scheme);
  QuantPlan plan(cfg, Provenance{PlanSource::kOverride, "--scheme", "", "", id,
                                 "not covered by the override scheme"});
  plan.set_source(PlanSource::kOverride, "--scheme");
  const ImpliedArgs implied = implied_args(scheme);
  const Provenance applied{PlanSource::kOverride, "--scheme", "", "", id, "override scheme"};
  switch (scheme_family(scheme.kind)) {
    case SchemeFamily::kTransform:
      throw Error("--scheme " + id,
                  "a norm transform cannot be applied by override; it comes with an msModelSlim "
                  "checkpoint's quant_model_description.json");
    case SchemeFamily::kKvCache:
      for (const AttentionModule& a : plan.modules().attentions()) {
        PlanEntry& e = plan.mutable_entry(a.prefix);
        e.scheme = scheme;
        e.kv_cache = implied.kv_cache;
        e.why = applied;
      }
      break;
    case SchemeFamily::kWeight:
      for (const LinearModule& l : plan.modules().linears()) {
        const std::optional<SchemeId> s = override_scheme_of(l, scheme);
        if (!s) continue;
        PlanEntry& e = plan.mutable_entry(l.prefix);
        if (unquantized.count(l.prefix)) {
          e.why = Provenance{
              PlanSource::kOverride, "--scheme", "", "", "", "ignored: stays in the model dtype"};
          continue;
        }
        e.scheme = *s;
        if (e.quantized()) {
          e.weights = implied.weights;
          e.input_activations = implied.input_activations;
          e.format = "override";
        }
        e.why = applied;
      }
      break;
  }
  plan.finalize();
  return plan;
}

QuantPlan build_quant_plan(const ModelConfig& cfg, const QuantSources& src) {
  if (src.override_scheme) {
    QuantPlan plan = plan_from_override(cfg, parse_scheme_id(*src.override_scheme));
    if (src.msmodelslim_description)
      plan.add_warning("--scheme " + *src.override_scheme + " overrides the checkpoint's " +
                       src.msmodelslim_file + ", which was not applied");
    else if (src.quantization_config && !src.quantization_config->is_null())
      plan.add_warning("--scheme " + *src.override_scheme + " overrides " + src.config_file +
                       " quantization_config, which was not applied");
    return plan;
  }
  if (src.msmodelslim_description) {
    QuantPlan plan = plan_from_msmodelslim(cfg, *src.msmodelslim_description, src.msmodelslim_file);
    if (src.quantization_config && !src.quantization_config->is_null())
      plan.add_warning(src.config_file + " quantization_config was not applied: " +
                       src.msmodelslim_file + " takes priority");
    return plan;
  }
  if (src.quantization_config && !src.quantization_config->is_null()) {
    QuantPlan plan = plan_from_quantization_config(cfg, *src.quantization_config, src.config_file);
    if (!src.implied_method.empty()) plan.add_rule(src.implied_method);
    return plan;
  }
  QuantPlan plan(cfg, Provenance{PlanSource::kDefault, "", "", "", "",
                                 "no quantization config in the checkpoint"});
  plan.finalize();
  return plan;
}

QuantPlan build_quant_plan(const ModelConfig& cfg, const fs::path& checkpoint_dir,
                           const std::optional<std::string>& override_scheme) {
  QuantSources src;
  src.override_scheme = override_scheme;

  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec))
    throw Error(checkpoint_dir.string(), "not a checkpoint directory");
  fs::path desc = checkpoint_dir / "quant_model_description.json";
  if (!fs::exists(desc, ec)) {
    // v0 files are named after the type: quant_model_description_w8a8.json.
    std::vector<fs::path> v0;
    for (fs::directory_iterator it(checkpoint_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("quant_model_description_", 0) == 0 && it->path().extension() == ".json")
        v0.push_back(it->path());
    }
    if (ec) throw Error(checkpoint_dir.string(), "cannot list the directory: " + ec.message());
    std::sort(v0.begin(), v0.end());
    if (v0.size() > 1) {
      std::string names;
      for (const auto& p : v0)
        names += (names.empty() ? "" : ", ") + p.filename().string();
      throw Error(checkpoint_dir.string(),
                  "several msModelSlim descriptions (" + names + "); keep exactly one");
    }
    desc = v0.empty() ? fs::path() : v0[0];
  }
  if (!desc.empty()) {
    src.msmodelslim_description = read_json_file(desc);
    src.msmodelslim_file = desc.string();
  }
  const fs::path config = checkpoint_dir / "config.json";
  src.config_file = config.string();
  if (fs::exists(config, ec)) {
    const Json cj = read_json_file(config);
    if (cj.is_object())
      if (auto it = cj.find("quantization_config"); it != cj.end() && !it->is_null())
        src.quantization_config = *it;
  }
  // No quantization_config: a producer's own config file beside config.json.
  if (desc.empty() && !src.quantization_config)
    for (const std::string& name : producer_config_files()) {
      const fs::path f = checkpoint_dir / name;
      if (!fs::exists(f, ec)) continue;
      src.quantization_config =
          with_implied_quant_method(read_json_file(f), name, &src.implied_method);
      src.config_file = f.string();
      break;
    }
  // msModelSlim writes its tensors to quant_model_weights*.safetensors and their types to the
  // description; without the description every quantized tensor would read as unexpected.
  if (desc.empty() && !src.quantization_config && !override_scheme) {
    for (fs::directory_iterator it(checkpoint_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("quant_model_weights", 0) == 0 && name.ends_with(".safetensors"))
        throw Error((checkpoint_dir / "quant_model_description.json").string(),
                    "is missing: " + name +
                        " is msModelSlim's quantized output, and without its description the "
                        "scheme of each tensor is unknown (copy the description beside it, or "
                        "give --scheme)");
    }
  }
  return build_quant_plan(cfg, src);
}

}  // namespace qparity
