#pragma once
// compressed-tensors `QuantizationArgs` (spec/FORMATS.md §2.2): the per-tensor description of
// one quantization (weights, input activations or the KV cache). Parsing applies the library's
// own normalization (lower-casing, strategy inference, legacy "128x128" block strings, actorder
// aliases) and its validation rules, but tolerates unknown keys (observer, observer_kwargs and
// whatever newer versions add), since a reader must not break on calibration-only fields.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/json_util.h"

namespace qparity {

enum class QuantType : uint8_t { kInt, kFloat };
enum class QuantStrategy : uint8_t {
  kTensor,
  kChannel,
  kGroup,
  kBlock,
  kToken,
  kTensorGroup,
  kAttnHead
};
// `dynamic`: false, true, or "local" (only the per-group scales are dynamic; NVFP4 activations).
enum class DynamicMode : uint8_t { kStatic, kDynamic, kLocal };
// `actorder`: "group" (alias "dynamic", or true) stores weight_g_idx; "weight" (alias "static")
// only changed calibration and leaves the format alone.
enum class ActOrder : uint8_t { kNone, kGroup, kWeight };

std::string_view to_string(QuantType t);
std::string_view to_string(QuantStrategy s);
std::string_view to_string(DynamicMode d);
std::string_view to_string(ActOrder a);

struct QuantArgs {
  int num_bits = 8;
  QuantType type = QuantType::kInt;
  bool symmetric = true;
  QuantStrategy strategy = QuantStrategy::kTensor;        // after inference, never "unset"
  std::optional<int64_t> group_size;                      // as written (-1 means channel)
  std::optional<std::array<int64_t, 2>> block_structure;  // [rows, cols]
  DynamicMode dynamic = DynamicMode::kStatic;
  ActOrder actorder = ActOrder::kNone;
  std::optional<std::string> scale_dtype;  // normalized to "torch.<name>"
  std::optional<std::string> zp_dtype;     // as written, normalized; null when symmetric

  bool is_dynamic() const { return dynamic != DynamicMode::kStatic; }
  // Group size when strategy is group / tensor_group, else 0.
  int64_t effective_group_size() const;
  friend bool operator==(const QuantArgs&, const QuantArgs&) = default;
};

// Parses one QuantizationArgs object; `where` names it in errors
// ("config.json: key 'quantization_config.config_groups.group_0.weights'").
QuantArgs parse_quant_args(const Json& j, const std::string& where);
Json to_json(const QuantArgs& a);
// One line for messages and listings: "int4 group(32) sym static".
std::string describe(const QuantArgs& a);

}  // namespace qparity
