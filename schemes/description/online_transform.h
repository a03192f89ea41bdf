#pragma once
// compressed-tensors' transform_config (transform/transform_config.py, transform_scheme.py,
// transform_args.py; docs/TRANSFORMS.md): rotations SpinQuant, QuaRot and QuIP recipes write.
//
// Each config group is a TransformScheme: a type (hadamard, random-hadamard, random-matrix), an
// optional block size head_dim, randomize, precision, and a list of TransformArgs (targets,
// ignore, location, inverse). compressed-tensors' TransformFactory._apply_to_module then
//   - fuses the offline locations (weight_input, weight_output) into the stored weights and
//     deletes the transform: nothing is applied at load or run time;
//   - keeps the online locations as hooks on the module and saves the transform's matrix with
//     the model: `<module>.<group>_<location>.weight` (and `.perm` when randomize), shared
//     matrices saved once (transformers' save_pretrained keeps one name of tied tensors), so a
//     module may carry no copy of its own.
// An online transform at `input` multiplies the linear's input, at `output` its output:
//     value' = value @ T
// with T the stored matrix, row/column-permuted by perm ([perm][:, perm]) and transposed when
// inverse, divided by sqrt(size) for the Hadamard types (stored with entries +-1); a random-matrix
// T is stored as is (its inverse stored as its own matrix). head_dim makes T block diagonal with
// head_dim blocks. vLLM runs the same two locations (CompressedTensorsLinearTransformMethod) and
// refuses q_attn / k_cache, which qparity refuses by name as well.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config/model_config.h"
#include "core/json_util.h"
#include "schemes/description/module_names.h"

namespace qparity {

class QuantPlan;

enum class TransformType : uint8_t { kHadamard, kRandomHadamard, kRandomMatrix };
enum class TransformLocation : uint8_t {
  kInput,
  kWeightInput,
  kWeightOutput,
  kOutput,
  kQAttn,
  kKCache,
};

std::string to_string(TransformType t);
std::string to_string(TransformLocation l);
bool is_online(TransformLocation l);

struct TransformApply {
  std::vector<std::string> targets;
  std::vector<std::string> ignore;
  TransformLocation location = TransformLocation::kInput;
  bool inverse = false;
};

struct TransformGroup {
  std::string name;
  TransformType type = TransformType::kHadamard;
  bool randomize = false;
  std::optional<int64_t> head_dim;
  std::string precision = "float32";  // torch dtype name of the online product
  std::vector<TransformApply> apply;
  std::string where;  // the config file ("config.json")
  std::string path;   // "quantization_config.transform_config.config_groups.v"

  bool online() const;  // any online location
  // The config key of `sub` below this group, as messages name it:
  // "config.json: key 'quantization_config.transform_config.config_groups.v.apply[0]'".
  std::string key(const std::string& sub = "") const;
};

// One online transform of one linear, as a plan entry carries it.
struct OnlineTransform {
  std::string group;  // the transform_config group name ("v", "R4")
  TransformType type = TransformType::kHadamard;
  TransformLocation location = TransformLocation::kInput;  // kInput or kOutput
  bool inverse = false;
  bool randomize = false;
  int64_t size = 0;  // the matrix's order: head_dim, or in_features (input) / out_features
  std::string precision;
  std::string key;  // the apply entry's config key

  // "<group>_<location>": the submodule compressed-tensors registers; its tensors are
  // `<module>.<stem>.weight` and `<module>.<stem>.perm`.
  std::string stem() const;
  // The same rotation (every field but the config key).
  bool operator==(const OnlineTransform& o) const;
};

// Parses quantization_config.transform_config. Refused by name: requires_grad (a training-time
// parametrization), q_attn / k_cache (attention hooks no engine runs), unknown types and
// locations, a non-positive head_dim.
// `where` is the config file; the block sits at quantization_config.transform_config.
std::vector<TransformGroup> parse_transform_config(const Json& j, const std::string& where);

// The linears (canonical prefixes, model order) that apply entry `index` of `g` targets and does
// not ignore. A module that is not a linear (the embedding, an attention, an expert stack) matched
// by an online entry is an Error; for an offline entry it is returned in `others` (the writer
// refuses it; the reader needs nothing, the weights hold it).
std::vector<std::string> transform_linears(const TransformGroup& g, size_t index,
                                           const ModelConfig& cfg, const ModuleNames& mods,
                                           std::vector<std::string>* others = nullptr);

// Puts each online transform on the linears its targets match (names as the checkpoint names
// the modules, or class names) and its ignore entries do not; offline groups are recorded as a
// plan warning (already in the weights). Refused by name: an online transform on a module that is
// not a linear (embedding, attention), two input (or two output) transforms on one linear, a
// head_dim that does not divide the size. Called by the compressed-tensors plan builder before
// finalize().
void apply_transform_config(const std::vector<TransformGroup>& groups, const ModelConfig& cfg,
                            QuantPlan& plan);

}  // namespace qparity
