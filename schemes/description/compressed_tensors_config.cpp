#include "schemes/description/compressed_tensors_config.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include "core/error.h"
#include "core/safetensors/language_model_names.h"
#include "schemes/description/awq_config.h"
#include "schemes/description/config_keys.h"
#include "schemes/description/ct_pattern.h"
#include "schemes/description/gpt_oss_mxfp4_config.h"
#include "schemes/description/gptq_config.h"
#include "schemes/description/modelopt_config.h"
#include "schemes/description/online_transform.h"

namespace qparity {

namespace {

const char* const kQc = "quantization_config";

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Presets of compressed_tensors.quantization.quant_scheme (PRESET_SCHEMES), as JSON so that they
// go through the same parser as inline schemes. Observer-only variants (NVFP4_46) are listed
// because their tensors are those of the base preset.
struct Preset {
  const char* name;
  const char* weights;  // nullptr: none
  const char* inputs;   // nullptr: none
};

constexpr const char* kNvfp4W =
    R"({"num_bits":4,"type":"float","strategy":"tensor_group","symmetric":true,"dynamic":false,"group_size":16,"scale_dtype":"torch.float8_e4m3fn","zp_dtype":"torch.float8_e4m3fn"})";
constexpr const char* kNvfp4A =
    R"({"num_bits":4,"type":"float","strategy":"tensor_group","symmetric":true,"dynamic":"local","group_size":16,"scale_dtype":"torch.float8_e4m3fn","zp_dtype":"torch.float8_e4m3fn"})";
constexpr const char* kMxfp4W =
    R"({"num_bits":4,"type":"float","strategy":"group","symmetric":true,"dynamic":false,"group_size":32,"scale_dtype":"torch.uint8","zp_dtype":"torch.uint8"})";
constexpr const char* kMxfp4A =
    R"({"num_bits":4,"type":"float","strategy":"group","symmetric":true,"dynamic":true,"group_size":32,"scale_dtype":"torch.uint8","zp_dtype":"torch.uint8"})";
constexpr const char* kMxfp8W =
    R"({"num_bits":8,"type":"float","strategy":"group","symmetric":true,"dynamic":false,"group_size":32,"scale_dtype":"torch.uint8","zp_dtype":"torch.uint8"})";
constexpr const char* kMxfp8A =
    R"({"num_bits":8,"type":"float","strategy":"group","symmetric":true,"dynamic":true,"group_size":32,"scale_dtype":"torch.uint8","zp_dtype":"torch.uint8"})";
constexpr const char* kInt8ChW =
    R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":true,"dynamic":false})";
constexpr const char* kInt8TokA =
    R"({"num_bits":8,"type":"int","strategy":"token","symmetric":true,"dynamic":true})";
constexpr const char* kInt4G128W =
    R"({"num_bits":4,"type":"int","strategy":"group","group_size":128,"symmetric":true,"dynamic":false})";
// compressed-tensors' _int_wnam(b, a): int b-bit group-128 symmetric weights, a < 16: int a-bit
// symmetric dynamic per-token inputs.
#define QP_INT_G128W(b) \
  R"({"num_bits":)" #b  \
  R"(,"type":"int","strategy":"group","group_size":128,"symmetric":true,"dynamic":false})"
constexpr const char* kInt4TokA =
    R"({"num_bits":4,"type":"int","strategy":"token","symmetric":true,"dynamic":true})";

constexpr Preset kPresets[] = {
    {"UNQUANTIZED", nullptr, nullptr},
    {"W8A16",
     R"({"num_bits":8,"type":"int","strategy":"group","group_size":128,"symmetric":true,"dynamic":false})",
     nullptr},
    {"W4A16", kInt4G128W, nullptr},
    {"W4A16_ASYM",
     R"({"num_bits":4,"type":"int","strategy":"group","group_size":128,"symmetric":false,"dynamic":false})",
     nullptr},
    {"W8A8", kInt8ChW, kInt8TokA},
    {"INT8", kInt8ChW, kInt8TokA},
    {"W4A8", kInt4G128W, kInt8TokA},
    {"W4AFP8", kInt4G128W,
     R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})"},
    {"W2A16", QP_INT_G128W(2), nullptr},
    {"W3A16", QP_INT_G128W(3), nullptr},
    {"W5A16", QP_INT_G128W(5), nullptr},
    {"W6A16", QP_INT_G128W(6), nullptr},
    {"W7A16", QP_INT_G128W(7), nullptr},
    {"W2A8", QP_INT_G128W(2), kInt8TokA},
    {"W3A8", QP_INT_G128W(3), kInt8TokA},
    {"W5A8", QP_INT_G128W(5), kInt8TokA},
    {"W6A8", QP_INT_G128W(6), kInt8TokA},
    {"W7A8", QP_INT_G128W(7), kInt8TokA},
    {"W2A4", QP_INT_G128W(2), kInt4TokA},
    {"W3A4", QP_INT_G128W(3), kInt4TokA},
    {"W4A4", QP_INT_G128W(4), kInt4TokA},
    {"FP8", R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true,"dynamic":false})",
     R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":true,"dynamic":false})"},
    {"FP8_DYNAMIC",
     R"({"num_bits":8,"type":"float","strategy":"channel","symmetric":true,"dynamic":false})",
     R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})"},
    {"FP8_BLOCK",
     R"({"num_bits":8,"type":"float","strategy":"block","symmetric":true,"dynamic":false,"block_structure":[128,128]})",
     R"({"num_bits":8,"type":"float","strategy":"group","symmetric":true,"dynamic":true,"group_size":128})"},
    {"NVFP4A16", kNvfp4W, nullptr},
    {"NVFP4A16_46", kNvfp4W, nullptr},
    {"NVFP4", kNvfp4W, kNvfp4A},
    {"NVFP4_46", kNvfp4W, kNvfp4A},
    {"MXFP4A16", kMxfp4W, nullptr},
    {"MXFP4", kMxfp4W, kMxfp4A},
    {"MXFP8A16", kMxfp8W, nullptr},
    {"MXFP8", kMxfp8W, kMxfp8A},
};

std::optional<QuantArgs> opt_args(const Json& j, std::string_view key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return parse_quant_args(*it, key_where(where, std::string(key)));
}

// The first module that is not a linear (expert stack, attention, norm, other) which `p` names
// by prefix or class, as "prefix (Class)"; empty if none. Used to explain targets and ignore
// entries that match no linear.
// Module names are matched as the checkpoint's modules are named: an image-text model's
// language model under model.language_model.* (language_model_names.h).
std::string first_non_linear_match(const ModelConfig& cfg, const ModuleNames& mods,
                                   const Pattern& p) {
  std::string hit;
  auto consider = [&](const std::string& prefix, const std::string& cls) {
    if (hit.empty() &&
        (p.matches_name(language_model_checkpoint_name(cfg, prefix)) || p.matches_class(cls)))
      hit = prefix + " (" + cls + ")";
  };
  for (const auto& s : mods.expert_stacks())
    consider(s.prefix, s.class_name);
  for (const auto& a : mods.attentions())
    consider(a.prefix, a.class_name);
  for (const auto& n : mods.norms())
    consider(n.prefix, n.class_name);
  for (const auto& o : mods.others())
    consider(o.prefix, o.class_name);
  // An image-text checkpoint's vision tower (its linears and its merger's): producers' ignore
  // lists name it; the reference does not run it, so it has no plan entries.
  // Exact names anywhere under model.visual (real configs list every block's linears, the
  // merger's and the deepstack mergers'); a regex by the tower's module shapes.
  if (hit.empty() && cfg.image_text) {
    const char* const kTower = "model.visual (the vision tower, not run on text-only input)";
    if (!p.is_regex && (p.text.rfind("model.visual.", 0) == 0 || p.text == "model.visual"))
      hit = kTower;
    for (const char* v :
         {"model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.attn.proj",
          "model.visual.blocks.0.mlp.linear_fc1", "model.visual.blocks.0.mlp.linear_fc2",
          "model.visual.merger.linear_fc1", "model.visual.merger.linear_fc2",
          "model.visual.deepstack_merger_list.0.linear_fc1"})
      if (hit.empty() && p.matches_name(v)) hit = kTower;
  }
  return hit;
}

const std::string& ct_format_of(const CtGroup& g, const CompressedTensorsConfig& c,
                                const std::string& group_key) {
  if (g.format) return *g.format;
  if (c.format == "mixed-precision")
    throw Error(group_key, "the top-level format is mixed-precision but this group has no format");
  return c.format;
}

// compressors/format.py's inference order, for configs that omit `format`.
std::string infer_format(const CtGroup& g) {
  if (!g.weights) return "dense";
  const QuantArgs& w = *g.weights;
  const bool mx = w.type == QuantType::kFloat && w.strategy == QuantStrategy::kGroup &&
                  w.group_size == 32 && w.scale_dtype == "torch.uint8";
  if (mx && w.num_bits == 4) return "mxfp4-pack-quantized";
  if (mx && w.num_bits == 8) return "mxfp8-quantized";
  if (w.type == QuantType::kFloat && w.num_bits == 4 && w.group_size == 16)
    return "nvfp4-pack-quantized";
  if (w.type == QuantType::kInt && g.input_activations) return "int-quantized";
  if (w.type == QuantType::kInt) return "pack-quantized";
  if (w.type == QuantType::kFloat && w.num_bits == 8) return "float-quantized";
  return "naive-quantized";
}

struct Resolved {
  SchemeId scheme;
  std::string format;
};

// (weights, input_activations, format) of one group on one module -> a qparity scheme, or an
// Error naming the module and the violated constraint.
Resolved resolve_scheme(const CtGroup& g, const std::string& format, const LinearModule& m) {
  const std::string& where = m.prefix;
  const std::string gname = "config group '" + g.name + "'";
  if (g.output_activations)
    throw Error(where, "output activation quantization (" + gname + ") is not implemented");
  if (!g.weights) {
    if (g.input_activations)
      throw Error(where, "activation-only quantization (" + gname +
                             " has input_activations but no weights) is not implemented");
    return {SchemeId{SchemeKind::kBf16, 0}, "dense"};
  }
  const QuantArgs& w = *g.weights;
  const std::optional<QuantArgs>& a = g.input_activations;
  if (w.is_dynamic())
    throw Error(where, "dynamic weight quantization (" + gname + ") is not a checkpoint format");
  if (format == "dense" || format == "fakequant")
    throw Error(where, "format '" + format +
                           "' stores unquantized (fake-quantized) weights; qparity reads "
                           "compressed checkpoints");
  if (format == "sparse-bitmask" || format == "sparse-24-bitmask" || format == "marlin-24")
    throw Error(where, "format '" + format + "' is not implemented");
  auto require_format = [&](const std::string& label, std::initializer_list<const char*> ok) {
    for (const char* f : ok)
      if (format == f) return;
    throw Error(where, label + " requires format " + *ok.begin() + ", got '" + format + "'");
  };
  const std::string ws = std::string(to_string(w.strategy));

  if (w.type == QuantType::kInt) {
    const bool int8_w8a8 =
        a && w.num_bits == 8 && a->type == QuantType::kInt && a->num_bits == 8 &&
        (w.strategy == QuantStrategy::kChannel || w.strategy == QuantStrategy::kTensor);
    if (a && !int8_w8a8) {
      // compressed-tensors' WnA8 / W4AFP8 space: packed-int weights (any point) with 8-bit
      // per-token inputs. int-quantized stores the codes unpacked (I8 `weight`), pack-quantized
      // packed (llm-compressor's W4AFP8 example saves it so, for vLLM's CompressedTensorsW4A8Fp8).
      SchemeId point = packed_int_scheme(w, where + " (" + gname + ")");
      point.int_inputs = int_weight_inputs_of(*a, where + " (" + gname + ") input_activations");
      require_format("W" + std::to_string(w.num_bits) +
                         (point.int_inputs == IntWeightInputs::kInt8Token ? "A8" : "AFP8") +
                         " integer weights",
                     {"int-quantized", "pack-quantized", "naive-quantized"});
      return {point, format};
    }
    if (a) {
      const char* label = "W8A8-INT8";
      const SchemeId point = w8a8_int8_scheme(w, *a, where + " (" + gname + ")");
      require_format(label, {"int-quantized", "naive-quantized"});
      return {point, format};
    }
    // Weight-only integers: any point of the pack-quantized space (bits 2..8, group / channel /
    // tensor, symmetric or not, actorder), as compressed-tensors' own presets W4A16, W4A16_ASYM
    // and W8A16 write it.
    require_format("W" + std::to_string(w.num_bits) + "A16 integer weights", {"pack-quantized"});
    const SchemeId point = packed_int_scheme(w, where + " (" + gname + ")");
    if (m.in_expert_stack() && point.int_weights == IntWeightPoint{}) {
      // SGLang's CompressedTensorsMxInt4MoE asserts `not actorder` (so "weight" fails too).
      if (w.actorder != ActOrder::kNone)
        throw Error(where, "mxint4 (W4A16 group 32 on MoE experts) requires no actorder, got '" +
                               std::string(to_string(w.actorder)) + "'");
      return {SchemeId{SchemeKind::kMxint4, 0}, format};
    }
    return {point, format};
  }

  // Float weights.
  if (a && a->type != QuantType::kFloat)
    throw Error(where, "float weights with int input activations (" + describe(*a) +
                           ") are not implemented");
  if (!w.symmetric) throw Error(where, "float weights must be symmetric, got " + describe(w));
  if (w.num_bits == 4) {
    if (w.strategy == QuantStrategy::kTensorGroup) {
      if (*w.group_size != 16)
        throw Error(where, "NVFP4 requires group_size 16, got " + std::to_string(*w.group_size));
      if (w.scale_dtype && *w.scale_dtype != "torch.float8_e4m3fn")
        throw Error(where, "NVFP4 requires scale_dtype torch.float8_e4m3fn, got " + *w.scale_dtype);
      if (a && !(a->num_bits == 4 && a->strategy == QuantStrategy::kTensorGroup &&
                 a->group_size == 16 && a->dynamic == DynamicMode::kLocal && a->symmetric))
        throw Error(where,
                    "NVFP4 requires input activations float4 tensor_group(16) with dynamic "
                    "\"local\", or none; got " +
                        describe(*a));
      require_format("NVFP4", {"nvfp4-pack-quantized"});
      return {SchemeId{.kind = SchemeKind::kNvfp4, .weight_only = !a.has_value()}, format};
    }
    if (w.strategy == QuantStrategy::kGroup) {
      if (*w.group_size != 32)
        throw Error(where, "MXFP4 requires group_size 32, got " + std::to_string(*w.group_size));
      if (w.scale_dtype != "torch.uint8")
        throw Error(where, "MXFP4 requires scale_dtype torch.uint8 (E8M0 scales), got " +
                               w.scale_dtype.value_or("none"));
      if (a && !(a->num_bits == 4 && a->strategy == QuantStrategy::kGroup && a->group_size == 32 &&
                 a->dynamic == DynamicMode::kDynamic))
        throw Error(where,
                    "MXFP4 requires input activations float4 group(32) dynamic, or none; "
                    "got " +
                        describe(*a));
      require_format("MXFP4", {"mxfp4-pack-quantized"});
      return {SchemeId{.kind = SchemeKind::kMxfp4, .weight_only = !a.has_value()}, format};
    }
    throw Error(where,
                "FP4 weights require strategy tensor_group (NVFP4) or group (MXFP4), got " + ws);
  }

  // 8-bit float.
  if (a && a->num_bits != 8)
    throw Error(where, "FP8 weights need 8-bit input activations, got " + describe(*a));
  if (w.strategy == QuantStrategy::kGroup) {
    if (*w.group_size != 32)
      throw Error(where, "MXFP8 requires group_size 32, got " + std::to_string(*w.group_size));
    if (w.scale_dtype != "torch.uint8")
      throw Error(where, "MXFP8 requires scale_dtype torch.uint8 (E8M0 scales), got " +
                             w.scale_dtype.value_or("none"));
    if (a && !(a->strategy == QuantStrategy::kGroup && a->group_size == 32 &&
               a->dynamic == DynamicMode::kDynamic))
      throw Error(where,
                  "MXFP8 requires input activations float8 group(32) dynamic, or none; got " +
                      describe(*a));
    require_format("MXFP8", {"mxfp8-quantized"});
    return {SchemeId{.kind = SchemeKind::kMxfp8, .weight_only = !a.has_value()}, format};
  }
  require_format("FP8", {"float-quantized", "naive-quantized"});
  switch (w.strategy) {
    case QuantStrategy::kTensor:
      if (a && !(a->strategy == QuantStrategy::kTensor && !a->is_dynamic() && a->symmetric) &&
          !((a->strategy == QuantStrategy::kToken || a->strategy == QuantStrategy::kTensor) &&
            a->dynamic == DynamicMode::kDynamic))
        throw Error(where,
                    "FP8 per-tensor weights need static symmetric per-tensor, dynamic "
                    "per-token or per-tensor, or no input activations; got " +
                        describe(*a));
      return {SchemeId{.kind = SchemeKind::kFp8Tensor, .weight_only = !a.has_value()}, format};
    case QuantStrategy::kChannel:
      if (a && !(a->strategy == QuantStrategy::kToken && a->dynamic == DynamicMode::kDynamic))
        throw Error(where,
                    "FP8 channel weights need dynamic per-token input activations or none, "
                    "got " +
                        describe(*a));
      return {SchemeId{.kind = SchemeKind::kFp8Channel, .weight_only = !a.has_value()}, format};
    case QuantStrategy::kBlock: {
      const auto& b = *w.block_structure;
      if (b[0] != 128 || b[1] != 128)
        throw Error(where, "FP8 block weights require block_structure [128, 128], got [" +
                               std::to_string(b[0]) + ", " + std::to_string(b[1]) + "]");
      // FP8 weights with bf16 inputs (vLLM's CompressedTensorsW8A16Fp8 reads tensor, channel and
      // block): the point fp8-block-a16.
      if (!a) return {SchemeId{.kind = SchemeKind::kFp8Block, .weight_only = true}, format};
      if (!a->is_dynamic())
        throw Error(where, "FP8 block weights do not support static input activations (" +
                               describe(*a) +
                               "); they need dynamic per-token-group activations, group_size 128");
      if (!(a->strategy == QuantStrategy::kGroup && a->group_size == 128 &&
            a->dynamic == DynamicMode::kDynamic))
        throw Error(where,
                    "FP8 block weights need dynamic per-token-group input activations with "
                    "group_size 128, got " +
                        describe(*a));
      return {SchemeId{SchemeKind::kFp8Block, 0}, format};
    }
    case QuantStrategy::kGroup:
    case QuantStrategy::kToken:
    case QuantStrategy::kTensorGroup:
    case QuantStrategy::kAttnHead:
      break;
  }
  throw Error(where, "FP8 weights need strategy tensor, channel or block, got " + ws);
}

// ---- compressed-tensors ----

}  // namespace

bool format_stores_weight(const std::string& format) {
  return format != "pack-quantized" && format != "nvfp4-pack-quantized" &&
         format != "mxfp4-pack-quantized" && format != "marlin-24";
}

namespace {

// Marks the linears whose `weight` tensor the sparse compressor stored compressed: matched by a
// sparsity target (exact name, "re:" regex or class name, as config groups match), not by the
// sparsity ignore list, and stored with a tensor named `weight` by their scheme (the compressor
// only touches `<module>.weight`: a pack-quantized `weight_packed` stays as it is, which the
// plan records as a warning).
void apply_sparsity(const CtSparsity& sp, const ModelConfig& cfg, QuantPlan& plan,
                    const std::string& where) {
  std::vector<Pattern> targets, ignores;
  for (size_t i = 0; i < sp.targets.size(); ++i)
    targets.emplace_back(sp.targets[i], key_where(where, "targets[" + std::to_string(i) + "]"));
  for (size_t i = 0; i < sp.ignore.size(); ++i)
    ignores.emplace_back(sp.ignore[i], key_where(where, "ignore[" + std::to_string(i) + "]"));
  int64_t packed = 0;
  std::string first_packed;
  for (const LinearModule& m : plan.modules().linears()) {
    const std::string hf_name = language_model_checkpoint_name(cfg, m.prefix);
    if (!any_matches(targets, hf_name, m.class_name) || any_matches(ignores, hf_name, m.class_name))
      continue;
    PlanEntry& e = plan.mutable_entry(m.prefix);
    if (!format_stores_weight(e.format)) {
      if (packed++ == 0) first_packed = m.prefix;
      continue;
    }
    e.sparsity = sp.format;
  }
  if (packed > 0)
    plan.add_warning(where + ": " + std::to_string(packed) + " targeted linear(s) (first " +
                     first_packed + ") store no `weight` tensor (" +
                     plan.method_for(first_packed).scheme_string() +
                     "): the sparse compressor leaves them as their format stores them");
}

QuantPlan plan_from_compressed_tensors(const ModelConfig& cfg, const Json& qc,
                                       const std::string& where) {
  const CompressedTensorsConfig c = parse_compressed_tensors_config(qc, where);
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };

  QuantPlan plan(cfg, Provenance{PlanSource::kCompressedTensors, where, "", "", "",
                                 "not matched by any config group"});
  plan.set_source(PlanSource::kCompressedTensors, where);
  const ModuleNames& mods = plan.modules();

  // The on-disk layout is the format's, whatever quantization_status says: vLLM never reads the
  // status, and compressed-tensors <= 0.5 wrote compressed files (naive-quantized F8_E4M3 / I8
  // weights) with the modules' status "frozen". A dense ("frozen" today) checkpoint is refused
  // per module by its format. The loaders check every tensor the format names.
  const std::string status = c.quantization_status.value_or("compressed");
  if (status != "compressed")
    plan.add_warning(key("quantization_status") + ": '" + status +
                     "': the weights are read as their format stores them (as vLLM does; "
                     "compressed-tensors <= 0.5 recorded compressed checkpoints as 'frozen')");

  struct Target {
    size_t group;
    size_t index;
    Pattern pattern;
    bool matched = false;
  };
  std::vector<Target> targets;
  for (size_t gi = 0; gi < c.groups.size(); ++gi)
    for (size_t ti = 0; ti < c.groups[gi].targets.size(); ++ti) {
      const std::string k =
          key("config_groups." + c.groups[gi].name + ".targets[" + std::to_string(ti) + "]");
      targets.push_back({gi, ti, Pattern(c.groups[gi].targets[ti], k)});
    }
  struct Ignore {
    size_t index;
    Pattern pattern;
    bool matched = false;
  };
  std::vector<Ignore> ignores;
  for (size_t i = 0; i < c.ignore.size(); ++i)
    ignores.push_back({i, Pattern(c.ignore[i], key("ignore[" + std::to_string(i) + "]"))});

  for (const LinearModule& m : mods.linears()) {
    const std::string hf_name = language_model_checkpoint_name(cfg, m.prefix);
    // Which targets match, by specificity: exact name (0), regex (1), class name (2).
    int best = 3;
    std::vector<Target*> hits;
    for (Target& t : targets) {
      int level = 3;
      if (t.pattern.matches_name(hf_name))
        level = t.pattern.is_regex ? 1 : 0;
      else if (t.pattern.matches_class(m.class_name))
        level = 2;
      if (level == 3) continue;
      t.matched = true;
      if (level < best) {
        best = level;
        hits.clear();
      }
      if (level == best) hits.push_back(&t);
    }
    const Ignore* ignored = nullptr;
    for (Ignore& ig : ignores)
      if (ig.pattern.matches_name(hf_name) || ig.pattern.matches_class(m.class_name)) {
        ig.matched = true;
        if (!ignored) ignored = &ig;
      }
    PlanEntry& e = plan.mutable_entry(m.prefix);
    if (ignored) {
      e.why.target = ignored->pattern.text;
      e.why.key = "quantization_config.ignore[" + std::to_string(ignored->index) + "]";
      e.why.note = "ignored";
      continue;
    }
    if (hits.empty()) continue;
    // Equally specific targets from groups with different schemes: compressed-tensors and vLLM
    // break the tie differently (sorted names vs. config order), so the file is ambiguous.
    const CtGroup& g = c.groups[hits[0]->group];
    for (const Target* t : hits) {
      const CtGroup& h = c.groups[t->group];
      if (h.weights != g.weights || h.input_activations != g.input_activations ||
          h.output_activations != g.output_activations || h.format != g.format)
        throw Error(m.prefix, "matched by target '" + hits[0]->pattern.text +
                                  "' of config group '" + g.name + "' and by target '" +
                                  t->pattern.text + "' of config group '" + h.name +
                                  "', equally specific, with different schemes");
    }
    const std::string group_key = key("config_groups." + g.name);
    std::string format = ct_format_of(g, c, group_key);
    if (format.empty()) format = infer_format(g);
    const Resolved r = resolve_scheme(g, format, m);
    e.scheme = r.scheme;
    if (e.quantized()) {
      e.weights = g.weights;
      e.input_activations = g.input_activations;
      e.format = r.format;
    }
    e.source_type = g.preset;
    e.why.group = g.name;
    e.why.target = hits[0]->pattern.text;
    e.why.key = "quantization_config.config_groups." + g.name + ".targets[" +
                std::to_string(hits[0]->index) + "]";
    e.why.note = e.quantized() ? "matched" : "matched by a group that quantizes nothing";
  }

  // A target that matches no Linear is an error: a misspelt regex would silently leave layers
  // unquantized while the loader then finds quantized tensors (or the reverse).
  for (const Target& t : targets) {
    if (t.matched) continue;
    const CtGroup& g = c.groups[t.group];
    const std::string k =
        key("config_groups." + g.name + ".targets[" + std::to_string(t.index) + "]");
    const std::string other = first_non_linear_match(cfg, mods, t.pattern);
    if (!other.empty())
      throw Error(k, "target '" + t.pattern.text + "' of config group '" + g.name +
                         "' matches no Linear module, only " + other +
                         "; quantizing such modules is not implemented");
    throw Error(k, "target '" + t.pattern.text + "' of config group '" + g.name +
                       "' matches no module of the model");
  }
  // Real checkpoints carry ignore entries for modules other models have; only worth a warning.
  for (const Ignore& ig : ignores) {
    if (ig.matched) continue;
    if (first_non_linear_match(cfg, mods, ig.pattern).empty())
      plan.add_warning(key("ignore[" + std::to_string(ig.index) + "]") + ": '" + ig.pattern.text +
                       "' matches no module of the model");
  }

  if (c.sparsity) apply_sparsity(*c.sparsity, cfg, plan, key("sparsity_config"));
  apply_transform_config(c.transforms, cfg, plan);

  for (const NormModule& n : mods.norms())
    if (plan.find(n.prefix)) plan.mutable_entry(n.prefix).why.note.clear();
  for (const AttentionModule& a : mods.attentions())
    plan.mutable_entry(a.prefix).why.note = "no kv_cache_scheme";
  if (c.kv_cache_scheme) {
    const QuantArgs& kv = *c.kv_cache_scheme;
    const std::string k = key("kv_cache_scheme");
    if (kv.type != QuantType::kFloat || kv.num_bits != 8)
      throw Error(k, "only an FP8 KV cache (kv-fp8: type float, num_bits 8) is implemented, got " +
                         describe(kv));
    if (kv.strategy != QuantStrategy::kTensor && kv.strategy != QuantStrategy::kAttnHead)
      throw Error(k, "kv-fp8 requires strategy tensor or attn_head (vLLM's two), got " +
                         std::string(to_string(kv.strategy)));
    if (!kv.symmetric) throw Error(k, "kv-fp8 requires a symmetric scheme");
    if (kv.is_dynamic()) throw Error(k, "kv-fp8 requires static (calibrated) k/v scales");
    for (const AttentionModule& a : mods.attentions()) {
      PlanEntry& e = plan.mutable_entry(a.prefix);
      e.scheme = SchemeId{.kind = SchemeKind::kKvFp8,
                          .kv_per_head = kv.strategy == QuantStrategy::kAttnHead};
      e.kv_cache = kv;
      e.format = "compressed-tensors";
      e.why.key = "quantization_config.kv_cache_scheme";
      e.why.note = "kv_cache_scheme";
    }
  }
  plan.finalize();
  return plan;
}

// ---- quant_method "fp8" ----

QuantPlan plan_from_fp8_config(const ModelConfig& cfg, const Json& qc, const std::string& where) {
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };
  const std::string qw = key_where(where, kQc);
  // "e4m3" (DeepSeek-V3) and torch's name for it, "float8_e4m3fn" (MiniMax-M2.5), are one type.
  if (auto fmt = opt_string(qc, "fmt", qw); fmt && *fmt != "e4m3" && *fmt != "float8_e4m3fn")
    throw Error(key("fmt"), "'" + *fmt + "' is not implemented (fp8 schemes use e4m3)");
  const std::string act = opt_string(qc, "activation_scheme", qw).value_or("dynamic");
  if (act != "dynamic" && act != "static")
    throw Error(key("activation_scheme"), "expected 'static' or 'dynamic', got '" + act + "'");

  SchemeId scheme{SchemeKind::kFp8Tensor, 0};
  ImpliedArgs args = implied_args(scheme);
  if (auto it = qc.find("weight_block_size"); it != qc.end() && !it->is_null()) {
    const std::string k = key("weight_block_size");
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
        !(*it)[1].is_number_integer())
      throw Error(k, "expected [rows, cols], got " + it->dump());
    if ((*it)[0].get<int64_t>() != 128 || (*it)[1].get<int64_t>() != 128)
      throw Error(k, it->dump() + " is not implemented (fp8-block needs [128, 128])");
    if (act != "dynamic")
      throw Error(key("activation_scheme"),
                  "block-wise fp8 needs activation_scheme 'dynamic' (vLLM rejects 'static')");
    scheme = SchemeId{SchemeKind::kFp8Block, 0};
    args = implied_args(scheme);
  } else if (act == "dynamic") {
    args.input_activations = parse_quant_args(
        Json::parse(R"({"num_bits":8,"type":"float","strategy":"tensor","dynamic":true})"),
        "implied args");
  }

  std::vector<std::string> skip;
  std::string skip_key;
  for (const char* k : {"modules_to_not_convert", "ignored_layers"}) {
    auto it = qc.find(k);
    if (it == qc.end() || it->is_null()) continue;
    auto list = module_name_list(*it, key(k));
    if (!skip.empty() && !list.empty())
      throw Error(qw, "both modules_to_not_convert and ignored_layers are given");
    if (!list.empty()) {
      skip = std::move(list);
      skip_key = k;
    }
  }

  QuantPlan plan(cfg, Provenance{PlanSource::kFp8, where, "", "", "", ""});
  plan.set_source(PlanSource::kFp8, where);
  // An entry names a module or one of its ancestors ("model.layers.0.mlp" covers its linears).
  auto covers = [](const std::string& entry, const std::string& prefix) {
    return prefix == entry ||
           (prefix.size() > entry.size() && prefix.compare(0, entry.size(), entry) == 0 &&
            prefix[entry.size()] == '.');
  };
  std::vector<bool> used(skip.size(), false);
  for (const LinearModule& m : plan.modules().linears()) {
    PlanEntry& e = plan.mutable_entry(m.prefix);
    size_t hit = skip.size();
    for (size_t i = 0; i < skip.size(); ++i)
      if (covers(skip[i], m.prefix)) {
        used[i] = true;
        if (hit == skip.size()) hit = i;
      }
    if (hit < skip.size()) {
      e.why.target = skip[hit];
      e.why.key = std::string(kQc) + "." + skip_key + "[" + std::to_string(hit) + "]";
      e.why.note = "not converted";
      continue;
    }
    // Engines build lm_head and MoE routers without a quant method under quant_method fp8.
    if (m.kind == LinearKind::kLmHead || m.kind == LinearKind::kRouter) {
      e.why.note = "never converted by quant_method fp8";
      continue;
    }
    e.scheme = scheme;
    e.weights = args.weights;
    e.input_activations = args.input_activations;
    e.format = "fp8";
    e.source_type = "fp8";
    e.why.key = std::string(kQc) + ".quant_method";
    e.why.note = "converted";
  }
  for (size_t i = 0; i < skip.size(); ++i) {
    if (used[i] || plan.modules().contains(skip[i])) continue;
    plan.add_warning(key(skip_key + "[" + std::to_string(i) + "]") + ": '" + skip[i] +
                     "' matches no module of the model");
  }
  plan.finalize();
  return plan;
}

}  // namespace

const std::vector<std::string>& compressed_tensors_formats() {
  static const std::vector<std::string> formats = {
      "dense",           "int-quantized",        "float-quantized",      "naive-quantized",
      "pack-quantized",  "nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp8-quantized",
      "mixed-precision", "sparse-bitmask",       "sparse-24-bitmask",    "marlin-24",
      "fakequant"};
  return formats;
}

std::vector<std::string> compressed_tensors_presets() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets)
    out.emplace_back(p.name);
  return out;
}

bool same_quant_point(const std::optional<QuantArgs>& a, const std::optional<QuantArgs>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  return a->num_bits == b->num_bits && a->type == b->type && a->symmetric == b->symmetric &&
         a->strategy == b->strategy && a->effective_group_size() == b->effective_group_size() &&
         a->block_structure == b->block_structure && a->dynamic == b->dynamic &&
         (a->actorder == ActOrder::kGroup) == (b->actorder == ActOrder::kGroup);
}

const std::vector<SchemePreset>& scheme_presets() {
  static const std::vector<SchemePreset> presets = [] {
    std::vector<SchemePreset> out;
    for (const Preset& p : kPresets) {
      SchemePreset sp;
      sp.name = p.name;
      sp.producer = "compressed-tensors";
      const std::string where = "compressed-tensors preset " + sp.name;
      const CtGroup g = expand_preset(p.name, {"Linear"}, where);
      sp.args = g.weights ? "weights " + describe(*g.weights) : "no weights";
      sp.args += g.input_activations ? "; input activations " + describe(*g.input_activations)
                                     : "; no input activations";
      // The point on a dense linear whose K every group divides.
      LinearModule m;
      m.prefix = where;
      m.class_name = "Linear";
      m.kind = LinearKind::kDownProj;
      m.out_features = 4096;
      m.in_features = 4096;
      try {
        const SchemeId id = resolve_scheme(g, infer_format(g), m).scheme;
        // A --scheme id implies its args (implied_args): the preset names the id only when
        // those are the preset's, e.g. not NVFP4A16, whose weights nvfp4 reads from a config
        // but whose id implies W4A4 activations.
        const ImpliedArgs implied = implied_args(id);
        if (same_quant_point(implied.weights, g.weights) &&
            same_quant_point(implied.input_activations, g.input_activations))
          sp.scheme = id;
        else
          sp.why = "a checkpoint config with these args is read (as " + to_string(id) +
                   "'s method), but no --scheme id names this point yet (" + to_string(id) +
                   " implies " +
                   (implied.input_activations
                        ? "input activations " + describe(*implied.input_activations)
                        : std::string("no input activations")) +
                   ")";
      } catch (const Error& e) {
        sp.why = e.what();
        const std::string prefix = where + ": ";
        if (sp.why.rfind(prefix, 0) == 0) sp.why = sp.why.substr(prefix.size());
      }
      out.push_back(std::move(sp));
    }
    return out;
  }();
  return presets;
}

CtGroup expand_preset(const std::string& name, std::vector<std::string> targets,
                      const std::string& where) {
  const std::string up = upper(name);
  for (const Preset& p : kPresets) {
    if (up != p.name) continue;
    CtGroup g;
    g.name = name;
    g.targets = std::move(targets);
    g.preset = p.name;
    if (p.weights)
      g.weights = parse_quant_args(Json::parse(p.weights), where + " (preset weights)");
    if (p.inputs)
      g.input_activations = parse_quant_args(Json::parse(p.inputs), where + " (preset inputs)");
    return g;
  }
  throw Error(where, "a list of targets needs a preset group name, and '" + name +
                         "' is not one (presets: " + join(compressed_tensors_presets()) + ")");
}

bool ct_name_matches(std::string_view target, std::string_view module_name,
                     const std::string& where) {
  return Pattern(std::string(target), where).matches_name(module_name);
}

namespace {

// SparsityCompressionConfig (compressed-tensors <= 0.12 config/sparsity_config; removed with the
// sparse compressors in later releases, whose checkpoints stay on the Hub). "dense" records a
// sparsity without compressing it; the two bitmask formats are decompressed exactly at load
// (schemes/method/sparse_weight.h). marlin-24 is refused: its producer cannot decompress it
// (Marlin24Compressor.decompress raises NotImplementedError), so no exact reading is specified.
std::optional<CtSparsity> parse_sparsity_config(
    const Json& j, const std::function<std::string(const std::string&)>& key) {
  const std::string where = key("sparsity_config");
  CtSparsity s;
  s.format = opt_string(j, "format", where).value_or("dense");
  const std::string fk = key("sparsity_config.format");
  if (s.format == "marlin-24")
    throw Error(fk,
                "'marlin-24' (Marlin's 2:4 tile layout) cannot be read exactly: "
                "compressed-tensors' Marlin24Compressor has no decompress; qparity reads "
                "sparse-24-bitmask and sparse-bitmask");
  if (s.format != "dense" && s.format != "sparse-24-bitmask" && s.format != "sparse-bitmask")
    throw Error(fk, "unknown sparsity format '" + s.format +
                        "' (known: dense, sparse-24-bitmask, sparse-bitmask, marlin-24)");
  s.structure = opt_string(j, "sparsity_structure", where).value_or("unstructured");
  if (s.format == "sparse-24-bitmask" && s.structure != "2:4")
    throw Error(key("sparsity_config.sparsity_structure"),
                "sparse-24-bitmask stores exactly 2 of every 4 weights and requires "
                "sparsity_structure \"2:4\", got '" +
                    s.structure + "'");
  if (auto it = j.find("targets"); it != j.end() && !it->is_null())
    s.targets = as_string_list(*it, key("sparsity_config.targets"));
  if (auto it = j.find("ignore"); it != j.end() && !it->is_null())
    s.ignore = as_string_list(*it, key("sparsity_config.ignore"));
  if (s.format == "dense") return std::nullopt;  // nothing stored differently
  if (s.targets.empty())
    throw Error(key("sparsity_config.targets"),
                "a " + s.format + " sparsity_config needs the targets it compressed");
  return s;
}

}  // namespace

CompressedTensorsConfig parse_compressed_tensors_config(const Json& qc, const std::string& where) {
  const std::string qw = key_where(where, kQc);
  auto key = [&](const std::string& path) {
    return key_where(where, std::string(kQc) + "." + path);
  };
  require_object(qc, qw);
  CompressedTensorsConfig c;

  const auto& formats = compressed_tensors_formats();
  auto check_format = [&](const std::string& f, const std::string& k, bool top) {
    if (std::find(formats.begin(), formats.end(), f) == formats.end())
      throw Error(k, "unknown format '" + f + "' (known: " + join(formats) + ")");
    if (!top && f == "mixed-precision")
      throw Error(k, "mixed-precision is only valid as the top-level format");
  };
  if (auto f = opt_string(qc, "format", qw)) {
    check_format(*f, key("format"), true);
    c.format = *f;
  }
  c.quantization_status = opt_string(qc, "quantization_status", qw);
  c.version = opt_string(qc, "version", qw).value_or("");

  // A sparsity-only checkpoint (compressed-tensors writes no quantization block then) has no
  // config_groups; anything else without them is refused as before.
  const auto sparsity_it = qc.find("sparsity_config");
  const bool has_sparsity =
      sparsity_it != qc.end() && sparsity_it->is_object() && !sparsity_it->empty();
  const auto groups_it = qc.find("config_groups");
  if (groups_it == qc.end() && !has_sparsity) require_key(qc, "config_groups", qw);
  const Json groups = groups_it == qc.end() ? Json::object() : *groups_it;
  require_object(groups, key("config_groups"));
  for (const auto& [name, value] : groups.items()) {
    const std::string gk = key("config_groups." + name);
    CtGroup g;
    if (value.is_array() || value.is_string()) {
      g = expand_preset(name, as_string_list(value, gk), gk);
    } else {
      require_object(value, gk);
      g.name = name;
      g.targets = as_string_list(require_key(value, "targets", gk), key_where(gk, "targets"));
      g.weights = opt_args(value, "weights", gk);
      g.input_activations = opt_args(value, "input_activations", gk);
      g.output_activations = opt_args(value, "output_activations", gk);
      if (auto f = opt_string(value, "format", gk)) {
        check_format(*f, key("config_groups." + name + ".format"), false);
        g.format = *f;
      }
    }
    if (g.targets.empty()) throw Error(gk, "has no targets");
    // QuantizationScheme's own rules for activations.
    if (const auto& a = g.input_activations) {
      if (a->strategy == QuantStrategy::kChannel || a->strategy == QuantStrategy::kBlock)
        throw Error(key("config_groups." + name + ".input_activations"),
                    "strategy '" + std::string(to_string(a->strategy)) +
                        "' is not supported for activation quantization");
      if (a->actorder != ActOrder::kNone)
        throw Error(key("config_groups." + name + ".input_activations"),
                    "actorder cannot apply to activations");
    }
    if (g.output_activations && g.output_activations->actorder != ActOrder::kNone)
      throw Error(key("config_groups." + name + ".output_activations"),
                  "actorder cannot apply to activations");
    c.groups.push_back(std::move(g));
  }

  if (auto it = qc.find("ignore"); it != qc.end() && !it->is_null())
    c.ignore = as_string_list(*it, key("ignore"));
  if (auto it = qc.find("kv_cache_scheme"); it != qc.end() && !it->is_null())
    c.kv_cache_scheme = parse_quant_args(*it, key("kv_cache_scheme"));

  if (has_sparsity) c.sparsity = parse_sparsity_config(*sparsity_it, key);
  if (auto it = qc.find("transform_config");
      it != qc.end() && !it->is_null() && !(it->is_object() && it->empty()))
    c.transforms = parse_transform_config(*it, where);
  return c;
}

const std::vector<std::string>& producer_config_files() {
  static const std::vector<std::string> files = {"quantize_config.json", "quant_config.json",
                                                 "hf_quant_config.json"};
  return files;
}

Json with_implied_quant_method(Json block, const std::string& file_name, std::string* implied) {
  if (implied) implied->clear();
  if (!block.is_object() || block.contains("quant_method")) return block;
  const char* method = file_name == "quantize_config.json" ? "gptq"
                       : file_name == "quant_config.json"  ? "awq"
                                                           : nullptr;
  if (!method) return block;
  block["quant_method"] = method;
  if (implied)
    *implied = file_name + " has no quant_method: read as \"" + method + "\" (the file " +
               (std::string(method) == "gptq" ? "AutoGPTQ" : "AutoAWQ") + " writes)";
  return block;
}

QuantPlan plan_from_quantization_config(const ModelConfig& cfg, const Json& qc,
                                        const std::string& where) {
  const std::string qw = key_where(where, kQc);
  require_object(qc, qw);
  // ModelOpt's hf_quant_config.json has no quant_method: its "quantization" object says it all.
  if (is_modelopt_hf_quant_config(qc)) return plan_from_modelopt_config(cfg, qc, where);
  const std::string method = as_string(require_key(qc, "quant_method", qw),
                                       key_where(where, std::string(kQc) + ".quant_method"));
  if (method == "compressed-tensors") return plan_from_compressed_tensors(cfg, qc, where);
  if (method == "fp8") return plan_from_fp8_config(cfg, qc, where);
  if (method == "gptq") return plan_from_gptq_config(cfg, qc, where);
  if (method == "awq") return plan_from_awq_config(cfg, qc, where);
  if (method == "modelopt") return plan_from_modelopt_config(cfg, qc, where);
  if (method == "mxfp4") return plan_from_mxfp4_config(cfg, qc, where);
  throw Error(key_where(where, std::string(kQc) + ".quant_method"),
              "'" + method +
                  "' is not supported (supported: compressed-tensors, fp8, gptq, awq, modelopt, "
                  "mxfp4)");
}

}  // namespace qparity
