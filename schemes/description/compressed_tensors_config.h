#pragma once
// config.json `quantization_config` -> QuantPlan (spec/FORMATS.md §2.1, §2.9).
//
// quant_method "compressed-tensors": config groups (inline schemes, or preset names mapped to a
// target list, expanded as compressed_tensors.quantization.quant_scheme does), targets and ignore
// entries ("re:" regexes with Python re.match semantics, i.e. anchored at the start but not at the
// end; exact module names; class names such as "Linear"), kv_cache_scheme, per-group and
// top-level formats. A module matched by several targets takes the most specific one, as
// compressed-tensors' match_targets orders them: exact name, then regex, then class name; ignore
// wins over every target.
//
// quant_method "fp8" (HF FineGrainedFP8 / vLLM Fp8Config): weight_block_size [128, 128] ->
// fp8-block, none -> fp8-tensor; modules_to_not_convert / ignored_layers name unquantized modules.
//
// Every quantized module's (weights, input_activations, format) must map to one qparity scheme;
// anything else is an Error naming the module and the violated constraint. A target that matches
// no module is an Error; an ignore entry that matches nothing is a plan warning.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/online_transform.h"
#include "schemes/description/quant_args.h"
#include "schemes/description/quant_plan.h"

namespace qparity {

struct CtGroup {
  std::string name;
  std::vector<std::string> targets;
  std::optional<QuantArgs> weights;
  std::optional<QuantArgs> input_activations;
  std::optional<QuantArgs> output_activations;
  std::optional<std::string> format;  // per-group format, if written
  std::string preset;                 // the preset it was expanded from ("" for inline schemes)
};

// compressed-tensors' sparsity_config (SparsityCompressionConfig): which linears' `weight`
// tensors a sparse compressor stored as values plus a bitmask. The compressor ran after the
// quantization compressor, on tensors named `<module>.weight` only (the dense weight, or the
// F8_E4M3 / I8 codes of float-/int-/naive-quantized; a packed `weight_packed` is untouched).
struct CtSparsity {
  std::string format;                // "dense" (no-op), "sparse-24-bitmask", "sparse-bitmask"
  std::string structure;             // sparsity_structure: "2:4", "unstructured", ...
  std::vector<std::string> targets;  // as config group targets
  std::vector<std::string> ignore;   // its own ignore list (not quantization_config.ignore)
};

struct CompressedTensorsConfig {
  std::string format;  // top level; "mixed-precision" means "read each group's format"
  std::optional<std::string> quantization_status;
  std::string version;
  std::vector<CtGroup> groups;
  std::vector<std::string> ignore;
  std::optional<QuantArgs> kv_cache_scheme;
  std::optional<CtSparsity> sparsity;  // set when sparsity_config compresses anything
  // transform_config groups (online_transform.h): offline locations are already in the stored
  // weights; online input / output ones are applied by the linears they target.
  std::vector<TransformGroup> transforms;
};

// Whether a linear stored in `format` has a tensor named `weight` (the dense weight or its
// unpacked codes), the one tensor a sparse compressor compresses; the packed formats store
// weight_packed instead.
bool format_stores_weight(const std::string& format);

// The compressed-tensors CompressionFormat values qparity recognizes.
const std::vector<std::string>& compressed_tensors_formats();
// Preset names accepted as config group names (upper case; matching is case-insensitive).
std::vector<std::string> compressed_tensors_presets();
// Expands a preset group ("W4A16": ["Linear"]); throws naming `where` for unknown presets.
CtGroup expand_preset(const std::string& name, std::vector<std::string> targets,
                      const std::string& where);

// Parses a quant_method "compressed-tensors" quantization_config (no model needed).
CompressedTensorsConfig parse_compressed_tensors_config(const Json& qc, const std::string& where);

// compressed-tensors match_name: "re:<pat>" is Python re.match (anchored at the start only),
// anything else is an exact module name. Regex syntax errors throw an Error naming the pattern.
bool ct_name_matches(std::string_view target, std::string_view module_name,
                     const std::string& where);

// Whether two args describe the same point: the fields that change the checkpoint's tensors or
// the arithmetic (bits, type, symmetry, strategy, group size, block, dynamic, actorder group),
// not observers or calibration order.
bool same_quant_point(const std::optional<QuantArgs>& a, const std::optional<QuantArgs>& b);

// Checkpoints whose config.json has no quantization_config may carry their producer's own file:
// AutoGPTQ's quantize_config.json (its BaseQuantizeConfig, quant_method often absent: "gptq"),
// AutoAWQ's quant_config.json (w_bit / q_group_size / zero_point: "awq"). The file names qparity
// looks for, in that order, and the block with the implied quant_method filled in (unchanged when
// it names one); `implied` says what was filled in, empty when nothing was.
const std::vector<std::string>& producer_config_files();
Json with_implied_quant_method(Json block, const std::string& file_name, std::string* implied);

// The plan of any quantization_config: dispatches on quant_method ("compressed-tensors", "fp8");
// other methods are rejected by name. `where` is the config file ("config.json").
QuantPlan plan_from_quantization_config(const ModelConfig& cfg, const Json& qc,
                                        const std::string& where);

}  // namespace qparity
