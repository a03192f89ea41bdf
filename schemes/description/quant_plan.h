#pragma once
// QuantPlan: for every linear, MoE expert stack, attention layer (its KV cache) and norm of a
// model, which scheme applies with which parameters, or "not quantized", and why: which source
// decided (command-line override, msModelSlim quant_model_description.json, config.json
// quantization_config, or nothing) and which config group / target / JSON key matched.
// `method_for(prefix)` is where both engines' LinearMethod factories start.
//
// Sources, highest priority first (build_quant_plan):
//   1. an override scheme (`--scheme`), applied to every decoder linear (lm_head and MoE routers
//      stay unquantized) or, for a KV scheme, to every attention layer;
//   2. `quant_model_description.json` in the checkpoint directory, or a single v0
//      `quant_model_description_<type>.json`;
//   3. config.json `quantization_config` (compressed-tensors, quant_method "fp8", "gptq",
//      "awq"), or without one a producer's own file beside it (AutoGPTQ quantize_config.json,
//      AutoAWQ quant_config.json: with_implied_quant_method);
//   4. nothing: every linear bf16 (the model dtype), every KV cache kv-bf16.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/module_names.h"
#include "schemes/description/online_transform.h"
#include "schemes/description/quant_args.h"
#include "schemes/description/scheme_registry.h"

namespace qparity {

enum class ModuleRole : uint8_t { kLinear, kExpertStack, kKvCache, kNorm };
enum class PlanSource : uint8_t {
  kDefault,
  kOverride,
  kMsModelSlim,
  kCompressedTensors,
  kFp8,
  kGptq,
  kAwq,
  kModelOpt,
  kMxfp4,  // quant_method "mxfp4" (gpt-oss)
};

std::string_view to_string(ModuleRole r);
std::string_view to_string(PlanSource s);

// Why an entry has its scheme. Fields that do not apply stay empty.
struct Provenance {
  PlanSource source = PlanSource::kDefault;
  std::string file;    // "config.json", ".../quant_model_description.json", "--scheme"
  std::string group;   // compressed-tensors config group name
  std::string target;  // the target, ignore entry or modules_to_not_convert entry that matched
  std::string key;     // the JSON key that decided ("quantization_config.ignore[0]", ...)
  std::string note;    // one line for people ("ignored", "not matched by any config group")
};

struct PlanEntry {
  std::string prefix;
  ModuleRole role = ModuleRole::kLinear;
  // Always set for linears, expert stacks and KV caches (bf16 / kv-bf16 when not quantized);
  // for norms only when a transform (smoothquant) is folded in.
  std::optional<SchemeId> scheme;
  // The quantization as the producer describes it (compressed-tensors args, or the equivalent
  // args of an msModelSlim / fp8 / override scheme). Unset when not quantized.
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  std::optional<QuantArgs> kv_cache;  // KV-cache entries: how keys and values are stored
  // Checkpoint layout the loader reads: "dense", a compressed-tensors format
  // ("pack-quantized", "float-quantized", ...), "fp8" (quant_method fp8) or "msmodelslim".
  std::string format = "dense";
  // Linears only: how a sparse compressor stored the `weight` tensor on top of `format`
  // ("sparse-24-bitmask", "sparse-bitmask": <prefix>.compressed / .bitmask / .shape
  // [/ .row_offsets] in place of <prefix>.weight); empty when stored as the format says.
  std::string sparsity;
  // Linears only: compressed-tensors transform_config rotations applied at run time (at most one
  // at `input`, one at `output`); their matrices come from the checkpoint
  // (schemes/loading/online_transform_matrices.h).
  std::vector<OnlineTransform> transforms;
  std::string source_type;  // msModelSlim type ("W8A8"), compressed-tensors preset, ...
  Provenance why;

  // Copied from the module list so that consumers need no second lookup.
  int64_t layer = -1;
  int64_t expert = -1;
  ExpertShard shard = ExpertShard::kNone;
  std::string stack;         // expert linears: their stack's prefix
  int64_t out_features = 0;  // N (linears)
  int64_t in_features = 0;   // K (linears)

  bool quantized() const;
  std::string scheme_string() const;  // "fp8-block", or "none" for a plain norm
};

class QuantPlan {
 public:
  // Every module of `cfg`, not quantized, attributed to `why`.
  QuantPlan(const ModelConfig& cfg, Provenance why);

  // The entry of one module; throws an Error naming the prefix when the model has no such
  // module.
  const PlanEntry& method_for(std::string_view prefix) const;
  const PlanEntry* find(std::string_view prefix) const;
  // Execution order: per layer input_layernorm, q/k/v_proj, self_attn (KV cache), o_proj,
  // post_attention_layernorm, the MLP (router, expert stack, expert linears); then model.norm,
  // lm_head.
  const std::vector<PlanEntry>& entries() const { return entries_; }
  std::vector<PlanEntry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<PlanEntry>::const_iterator end() const { return entries_.end(); }
  const ModuleNames& modules() const { return *modules_; }

  PlanSource source() const { return source_; }
  const std::string& source_file() const { return source_file_; }
  // Non-fatal findings (ignore entries matching nothing, unfusable q/k/v schemes, config keys
  // the reader does not know, ...).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The producer and version rules the reader applied, one line each ("GPTQ checkpoint_format
  // gptq (v1): stored zero points are z - 1"), for `inspect`.
  const std::vector<std::string>& rules() const { return rules_; }
  // Number of entries per scheme string, for summaries.
  std::map<std::string, int64_t> summary() const;
  Json to_json() const;

  // --- for builders ---
  PlanEntry& mutable_entry(std::string_view prefix);
  void set_source(PlanSource s, std::string file);
  void add_warning(std::string w) { warnings_.push_back(std::move(w)); }
  void add_rule(std::string r) { rules_.push_back(std::move(r)); }
  // Checks the rules that span modules (expert stacks share one scheme, MoE routers and tied
  // lm_heads stay unquantized, group sizes divide K, mxint4 only on expert stacks) and fills the
  // expert-stack entries from their experts. Builders call it once, last.
  void finalize();

 private:
  std::shared_ptr<const ModuleNames> modules_;
  std::string model_dtype_;
  std::vector<PlanEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
  PlanSource source_ = PlanSource::kDefault;
  std::string source_file_;
  std::vector<std::string> warnings_;
  std::vector<std::string> rules_;
};

// What build_quant_plan reads, already parsed (for tests and fuzzers). The file names only label
// messages and provenance.
struct QuantSources {
  std::optional<std::string> override_scheme;
  std::optional<Json> msmodelslim_description;
  std::string msmodelslim_file = "quant_model_description.json";
  std::optional<Json> quantization_config;  // config.json's `quantization_config` value
  std::string config_file = "config.json";
  // Set when the block came from a producer's own file (quantize_config.json, ...) and its
  // quant_method was implied by the file: the plan records it as a rule.
  std::string implied_method;
};

QuantPlan build_quant_plan(const ModelConfig& cfg, const QuantSources& sources);
// Reads `quant_model_description.json` (or one v0 `quant_model_description_<type>.json`) and
// config.json from `checkpoint_dir`, then applies the source priority above.
QuantPlan build_quant_plan(const ModelConfig& cfg, const std::filesystem::path& checkpoint_dir,
                           const std::optional<std::string>& override_scheme);
// Source 1 on its own: `scheme` on every decoder linear (w4a16-g32 becomes mxint4 on expert
// stacks and mxint4 becomes w4a16-g32 elsewhere), or on every KV cache for a KV scheme. The
// linears named in `unquantized` (exact prefixes: an ignore list already resolved) stay in the
// model dtype; finalize() still rejects a partly ignored expert stack.
QuantPlan plan_from_override(const ModelConfig& cfg, const SchemeId& scheme,
                             const std::set<std::string>& unquantized = {});
// The scheme an override gives one linear: nullopt for lm_head, MoE routers and non-weight
// schemes; the w4a16-g32 / mxint4 swap by whether the linear is an expert.
std::optional<SchemeId> override_scheme_of(const LinearModule& l, const SchemeId& scheme);

// The QuantArgs a scheme implies when no compressed-tensors config spells them out
// (msModelSlim types, overrides, quant_method fp8). msModelSlim W8A16 always stores an offset,
// so its weights read as asymmetric; W8A8's activations are asymmetric per tensor.
struct ImpliedArgs {
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  std::optional<QuantArgs> kv_cache;
};
ImpliedArgs implied_args(const SchemeId& s);

}  // namespace qparity
