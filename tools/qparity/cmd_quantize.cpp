// `qparity quantize --in FP_CHECKPOINT --scheme ID --out DIR [--dialect D] [--calib TOKENS]`:
// post-training quantization of any bf16 / fp16 / fp32 Llama, Qwen3 or Qwen3-MoE checkpoint into
// a scheme, laid out as the scheme's producer lays it out (fixtures/checkpoint_quantizer.h:
// compressed-tensors config.json + safetensors, or msModelSlim quant_model_weights +
// quant_model_description.json). Static-activation schemes, smooth-quant and KV-cache schemes
// take their statistics from running the fp64 reference of the input checkpoint on calibration
// tokens: --calib (token ids: comma / space / newline separated), or --calib-synthetic N
// pseudo-random tokens (seeded) when none are given. Progress on stderr.
// --ignore ENTRY (repeatable: a module name, or re:<regex> as compressed-tensors' ignore entries)
// leaves linears in the model dtype. Before calibrating, the scheme's shape rules are checked
// (fixtures::scheme_exclusions): a linear the scheme cannot take that is not ignored is an error
// naming it and its rule; --ignore-unsupported ignores exactly those linears instead.
// --config FILE instead of --scheme: a full quantization_config (the block, or a config.json
// holding one) planned against the input model; the one point it asks for is written, with the
// linears it leaves unquantized ignored by name; a kv_cache_scheme beside the weights' point
// (FP8 weights with an FP8 cache) is written with them (--kv-cache ID asks for the same beside
// --scheme); config groups of different points (mixed precision) are each written with their
// own args, format and targets. A group that reads as two points, or args no scheme id names
// (fp8 inputs static where the id implies dynamic, ...) are refused naming them, before anything
// is read. A sparsity_config
// (sparse-24-bitmask, sparse-bitmask) is written as compressed-tensors wrote it (--sparsity F
// asks for the same beside --scheme): 2:4 magnitude-pruned, quantized, then compressed. A
// transform_config (QuIP / SpinQuant rotations) is written as compressed-tensors leaves it: the
// offline locations fused into the weights before quantization, the online matrices saved
// (fixtures/transform_writer.h).
// --format gptq|gptq_v2|awq writes an integer weight-only point in GPTQ's or AutoAWQ's layout and
// config instead (a --config with quant_method gptq / awq implies it): those producers'
// round-to-nearest codes, not their calibrated algorithms.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/error.h"
#include "core/json_util.h"
#include "fixtures/checkpoint_quantizer.h"
#include "golden/reference_run.h"
#include "reference_cpu/models/calibration.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/description/module_names.h"
#include "schemes/description/quant_plan.h"
#include "schemes/description/scheme_registry.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

struct QuantizeOptions {
  std::string in, out, scheme, config, dialect = "ideal", calib, sparsity, format, kv_cache;
  int64_t calib_synthetic = 2048;
  uint64_t seed = 0;
  bool force = false;
  std::vector<std::string> ignore;
  bool ignore_unsupported = false;
};

// The point a quantization_config asks for on `cfg`'s linears (or its KV cache), and the linears
// it leaves unquantized (their names, for --ignore).
struct ConfigPoint {
  SchemeId scheme;
  std::vector<std::string> unquantized;
  std::string sparsity;        // the sparse storage of every linear written, or ""
  std::string layout;          // "gptq" / "gptq_v2" / "awq" for those producers' configs, else ""
  std::optional<SchemeId> kv;  // a KV-cache point beside the weights' point
  // Several weight points: the config's groups (empty for one point).
  std::vector<fixtures::QuantizeCheckpointOptions::WeightGroup> groups;
  std::optional<Json> transform_config;  // written as given (rotations fused / saved)
};

// The targets of a config group as the config wrote them: a preset group's list, or the
// group's "targets".
std::vector<std::string> group_targets(const Json& block, const std::string& group,
                                       const std::string& where) {
  const std::string key = where + ".config_groups." + group;
  if (!block.contains("config_groups") || !block.at("config_groups").contains(group))
    throw Error(key, "internal: the plan names a group the config does not have");
  const Json& g = block.at("config_groups").at(group);
  const Json& t = g.is_array() ? g : g.at("targets");
  std::vector<std::string> out;
  for (const Json& v : t) {
    if (!v.is_string()) throw Error(key + ".targets", "a target is not a string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

ConfigPoint point_of_config(const ModelConfig& cfg, const std::string& file) {
  const Json j = read_json_file(file);
  const bool whole = j.is_object() && j.contains("quantization_config");
  const Json& block = whole ? j.at("quantization_config") : j;
  const std::string where = file + (whole ? ": quantization_config" : "");
  const QuantPlan plan = plan_from_quantization_config(cfg, block, where);
  for (const std::string& w : plan.warnings())
    std::cerr << "quantize: " << where << ": " << w << "\n";
  std::map<std::string, std::vector<std::string>> by_point;  // scheme id -> its modules
  std::map<std::string, std::pair<SchemeId, std::vector<std::string>>> by_group;  // group -> ...
  std::map<std::string, std::vector<std::string>> sparse;  // sparsity format -> its modules
  const PlanEntry* first = nullptr;
  ConfigPoint out;
  for (const LinearModule& l : plan.modules().linears()) {
    if (l.tied || l.kind == LinearKind::kLmHead) continue;
    const PlanEntry& e = plan.method_for(l.prefix);
    if (l.kind == LinearKind::kRouter) {
      if (e.quantized())
        throw Error(where, l.prefix + ": the config quantizes the MoE router (" +
                               e.scheme_string() +
                               "); quantize leaves routers unquantized, as the published "
                               "recipes do (ignore re:.*mlp.gate$)");
      continue;
    }
    sparse[e.sparsity].push_back(l.prefix);
    if (!e.quantized()) {
      out.unquantized.push_back(l.prefix);
      continue;
    }
    by_point[e.scheme_string()].push_back(l.prefix);
    if (!first) first = &e;
    auto [g, fresh] = by_group.try_emplace(e.why.group, *e.scheme, std::vector<std::string>{});
    if (!fresh && g->second.first != *e.scheme)
      throw Error(where, "config group '" + e.why.group + "' reads as " +
                             to_string(g->second.first) + " on " + g->second.second.front() +
                             " and as " + e.scheme_string() + " on " + l.prefix +
                             ": quantize writes one point per group");
    g->second.second.push_back(l.prefix);
    // The id writes its implied args: the config's must be that point, or the file written
    // would not be what the config asks for.
    const ImpliedArgs implied = implied_args(*e.scheme);
    if (!same_quant_point(implied.weights, e.weights) ||
        !same_quant_point(implied.input_activations, e.input_activations))
      throw Error(where, l.prefix + ": the config's args (weights " +
                             (e.weights ? describe(*e.weights) : "none") + "; input activations " +
                             (e.input_activations ? describe(*e.input_activations) : "none") +
                             ") are read as " + e.scheme_string() +
                             ", whose writer implies other args; no scheme id names this point "
                             "yet");
  }
  std::set<std::string> kv;
  for (const AttentionModule& a : plan.modules().attentions()) {
    const PlanEntry& e = plan.method_for(a.prefix);
    if (e.quantized()) kv.insert(e.scheme_string());
  }
  if (by_point.size() > 1) {
    // Several weight points: one per config group, each written with its own args.
    for (const auto& [name, point] : by_group) {
      if (name.empty())
        throw Error(where, point.second.front() +
                               ": quantized by no config group; quantize writes several weight "
                               "points only as the config's groups");
      out.groups.push_back({name, point.first, group_targets(block, name, where), point.second});
    }
  }
  if (kv.size() > 1)
    throw Error(where, "asks for " + std::to_string(kv.size()) + " KV-cache points (" +
                           *kv.begin() + ", " + *std::next(kv.begin()) +
                           "): quantize writes one kv_cache_scheme per checkpoint");
  if (!by_point.empty() && !kv.empty()) out.kv = parse_scheme_id(*kv.begin());
  // The writer gives one sparse storage to exactly the linears it writes: the quantized ones,
  // or every decoder linear of a sparsity-only config.
  for (const auto& [format, mods] : sparse) {
    if (format.empty()) continue;
    out.sparsity = format;
    const std::vector<std::string>& written = by_point.empty() ? mods : by_point.begin()->second;
    if (written != mods) {
      std::vector<std::string> odd;  // written but not sparse, or sparse but not written
      for (const std::string& m : written)
        if (std::find(mods.begin(), mods.end(), m) == mods.end()) odd.push_back(m);
      for (const std::string& m : mods)
        if (std::find(written.begin(), written.end(), m) == written.end()) odd.push_back(m);
      throw Error(where, "its sparsity_config (" + format + ") covers " +
                             std::to_string(mods.size()) + " linears, and " + odd.front() +
                             " (and " + std::to_string(odd.size() - 1) +
                             " more) is quantized but not sparse, or sparse but not quantized: "
                             "quantize writes one sparse storage for every linear it quantizes");
    }
  }
  if (by_point.empty() && kv.empty() && out.sparsity.empty())
    throw Error(where, "quantizes nothing of this model");
  if (const auto t = block.find("transform_config");
      t != block.end() && !t->is_null() && !(t->is_object() && t->empty()))
    out.transform_config = *t;
  if (!out.sparsity.empty() && !kv.empty())
    throw Error(where, "asks for a KV cache in " + *kv.begin() + " and a " + out.sparsity +
                           " sparsity: quantize writes one scheme per checkpoint");
  if (by_point.empty() && kv.empty()) {
    out.scheme = SchemeId{};  // sparsity only: the float weights, compressed
    out.unquantized.clear();
    for (const auto& [format, mods] : sparse)
      if (format.empty()) out.unquantized = mods;
    return out;
  }
  out.scheme = by_point.empty()     ? parse_scheme_id(*kv.begin())
               : out.groups.empty() ? *first->scheme
                                    : out.groups.front().scheme;
  if (first && (first->format == "gptq" || first->format == "gptq_v2" || first->format == "awq" ||
                first->format == "modelopt"))
    out.layout = first->format;
  if (first && first->format == "fp8") out.layout = "hf-fp8";
  return out;
}

void run(const QuantizeOptions& o) {
  if (o.scheme.empty() == o.config.empty())
    throw UsageError("quantize", "give exactly one of --scheme ID and --config FILE");
  std::vector<std::string> config_ignore;
  SchemeId scheme;
  std::optional<SchemeId> kv_cache;
  if (!o.kv_cache.empty()) kv_cache = parse_scheme_id(o.kv_cache);
  std::vector<fixtures::QuantizeCheckpointOptions::WeightGroup> groups;
  std::optional<Json> transform_config;
  std::string sparsity = o.sparsity;
  std::string layout = o.format;
  if (!o.config.empty()) {
    const ConfigPoint c =
        point_of_config(load_model_config(std::filesystem::path(o.in) / "config.json"), o.config);
    scheme = c.scheme;
    kv_cache = c.kv;
    groups = c.groups;
    transform_config = c.transform_config;
    config_ignore = c.unquantized;
    sparsity = c.sparsity;
    if (!layout.empty() && !c.layout.empty() && layout != c.layout)
      throw UsageError("quantize",
                       "--format " + layout + " contradicts " + o.config + " (" + c.layout + ")");
    if (layout.empty()) layout = c.layout;
    std::string points = to_string(scheme);
    if (!groups.empty()) {
      points.clear();
      for (const auto& g : groups)
        points += (points.empty() ? "" : ", ") + to_string(g.scheme) + " (group " + g.name + ", " +
                  std::to_string(g.linears.size()) + " linears)";
    }
    std::cerr << "quantize: " << o.config << " asks for " << points
              << (kv_cache ? " and a " + to_string(*kv_cache) + " KV cache" : "") << " ("
              << c.unquantized.size() << " linears left unquantized)\n";
  } else {
    scheme = parse_scheme_id(o.scheme);
  }
  const std::vector<Producer>& producers = scheme_info(scheme.kind).producers;
  // One default dialect everywhere (ideal: the format as written); the producer's own arithmetic
  // is one --dialect away, and every output says which was used.
  const Dialect dialect = parse_dialect(o.dialect);
  const bool msm_only = !producers.empty() && producers.front() == Producer::kMsModelSlim;
  if (o.dialect == "ideal")
    std::cerr << "quantize: dialect ideal (the default: the format as written; --dialect "
              << (msm_only ? "msmodelslim" : "compressed-tensors")
              << " for the producer's own arithmetic)\n";
  const ModelConfig cfg = load_model_config(std::filesystem::path(o.in) / "config.json");
  // Cheap checks first (headers only): calibration can take minutes.
  fixtures::QuantizeCheckpointOptions qo;
  qo.ignore = o.ignore;
  qo.ignore.insert(qo.ignore.end(), config_ignore.begin(), config_ignore.end());
  qo.ignore_unsupported = o.ignore_unsupported;
  qo.sparsity = sparsity;
  qo.layout = layout;
  qo.kv_cache = kv_cache;
  qo.groups = groups;
  qo.transform_config = transform_config;
  const fixtures::IgnorePlan ignored = fixtures::plan_ignore(o.in, scheme, dialect, qo);
  for (const fixtures::SchemeExclusion& x : ignored.added)
    std::cerr << "quantize: ignoring " << x.module << " (" << x.rule << ")\n";
  qo.ignore = ignored.entries;
  qo.ignore_unsupported = false;
  fixtures::StatsProviders stats;
  const bool calibrate = fixtures::needs_calibration(scheme, dialect) ||
                         (kv_cache && fixtures::needs_calibration(*kv_cache, dialect)) ||
                         std::any_of(groups.begin(), groups.end(), [&](const auto& g) {
                           return fixtures::needs_calibration(g.scheme, dialect);
                         });
  if (calibrate) {
    const std::vector<int64_t> tokens =
        o.calib.empty() ? reference::synthetic_tokens(o.calib_synthetic, cfg.vocab, o.seed)
                        : golden::file_inputs(o.calib, 0).tokens;
    std::cerr << "quantize: calibrating on " << tokens.size()
              << (o.calib.empty() ? " synthetic" : "") << " tokens through the fp64 reference of "
              << o.in << "\n";
    stats = fixtures::calibrate_checkpoint(o.in, tokens);
  }
  std::cerr << "quantize: " << (groups.empty() ? to_string(scheme) : "config groups")
            << (kv_cache ? " with a " + to_string(*kv_cache) + " KV cache" : "") << " (dialect "
            << qparity::to_string(dialect) << ") -> " << o.out << "\n";
  fixtures::quantize_checkpoint(o.in, scheme, dialect, o.out, stats,
                                o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse,
                                &std::cerr, qo);
}

}  // namespace

void add_quantize_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<QuantizeOptions>();
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a floating-point checkpoint into a scheme, as its producer writes it");
  cmd->add_option("--in", o->in, "floating-point Hugging Face checkpoint directory")->required();
  cmd->add_option("--scheme", o->scheme, "Scheme id or preset name (see `qparity schemes`)");
  cmd->add_option("--config", o->config,
                  "instead of --scheme: a quantization_config JSON (the block, or a config.json "
                  "holding one); the point it asks for is written, the linears it leaves "
                  "unquantized ignored")
      ->excludes("--scheme");
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dialect", o->dialect,
                  "producer arithmetic: ideal (the format as written) | compressed-tensors | "
                  "msmodelslim | vllm | sglang")
      ->capture_default_str()
      ->check(dialect_choices());
  cmd->add_option("--calib", o->calib, "file of calibration token ids");
  cmd->add_option("--calib-synthetic", o->calib_synthetic,
                  "pseudo-random calibration tokens when --calib is not given")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--seed", o->seed, "seed of the synthetic calibration tokens")
      ->capture_default_str()
      ->check(seed_check());
  cmd->add_option("--ignore", o->ignore,
                  "leave a linear in the model dtype: a module name "
                  "(model.layers.0.mlp.down_proj) or re:<regex> (matched from the start, as "
                  "compressed-tensors' ignore); repeatable")
      ->allow_extra_args(false);
  cmd->add_flag("--ignore-unsupported", o->ignore_unsupported,
                "ignore every linear whose shape the scheme cannot take (each is printed)");
  cmd->add_option("--sparsity", o->sparsity,
                  "with --scheme: store the written linears' weights as compressed-tensors' "
                  "sparse-24-bitmask (2:4 magnitude-pruned first) or sparse-bitmask")
      ->check(CLI::IsMember({"sparse-24-bitmask", "sparse-bitmask"}))
      ->excludes("--config");
  cmd->add_option("--format", o->format,
                  "write in another producer's layout: an integer weight-only point as gptq "
                  "(AutoGPTQ v1 zeros), gptq_v2 (GPTQModel) or awq (AutoAWQ GEMM), codes by "
                  "their round-to-nearest rule (no Hessian update, no AWQ scale search); "
                  "fp8-tensor or kv-fp8 as modelopt (hf_quant_config.json); fp8-block or "
                  "fp8-tensor as hf-fp8 (quant_method fp8); a gpt-oss model's mxfp4a16 as "
                  "gpt-oss (quant_method mxfp4: the experts' *_blocks / *_scales)")
      ->check(CLI::IsMember({"gptq", "gptq_v2", "awq", "modelopt", "hf-fp8", "gpt-oss"}));
  cmd->add_option("--kv-cache", o->kv_cache,
                  "with --scheme: also write this KV-cache point (kv-fp8, kv-fp8-head) beside "
                  "the weights, as compressed-tensors' kv_cache_scheme")
      ->check(CLI::IsMember({"kv-fp8", "kv-fp8-head"}))
      ->excludes("--config");
  cmd->add_flag("--force", o->force, "replace existing output files");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
