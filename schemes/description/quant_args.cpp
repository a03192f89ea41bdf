#include "schemes/description/quant_args.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "core/error.h"

namespace qparity {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

constexpr std::array<QuantStrategy, 7> kStrategies = {
    QuantStrategy::kTensor,  QuantStrategy::kChannel, QuantStrategy::kGroup,
    QuantStrategy::kBlock,   QuantStrategy::kToken,   QuantStrategy::kTensorGroup,
    QuantStrategy::kAttnHead};

// The torch dtypes compressed-tensors serializes as `str(dtype)`.
constexpr std::array<std::string_view, 12> kTorchDtypes = {
    "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "uint8",   "int8",    "int16",
    "int32",         "int64",       "bfloat16",       "float16", "float32", "float64"};

std::optional<std::string> parse_torch_dtype(const Json& j, std::string_view key,
                                             const std::string& where) {
  auto v = opt_string(j, key, where);
  if (!v) return std::nullopt;
  std::string name = v->rfind("torch.", 0) == 0 ? v->substr(6) : *v;
  if (std::find(kTorchDtypes.begin(), kTorchDtypes.end(), name) == kTorchDtypes.end())
    throw Error(key_where(where, key), "unknown torch dtype '" + *v + "'");
  return "torch." + name;
}

std::array<int64_t, 2> parse_block_structure(const Json& v, const std::string& where) {
  std::vector<int64_t> dims;
  if (v.is_string()) {
    // Legacy spelling "128x128".
    const std::string s = v.get<std::string>();
    const auto x = s.find('x');
    auto parse_dim = [&](const std::string& part) -> int64_t {
      if (part.empty() || part.size() > 9 ||
          !std::all_of(part.begin(), part.end(), [](unsigned char ch) { return std::isdigit(ch); }))
        throw Error(where,
                    "invalid block_structure '" + s + "' (expected [rows, cols] or \"RxC\")");
      return std::stoll(part);
    };
    if (x == std::string::npos)
      throw Error(where, "invalid block_structure '" + s + "' (expected [rows, cols] or \"RxC\")");
    dims = {parse_dim(s.substr(0, x)), parse_dim(s.substr(x + 1))};
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer())
        throw Error(where, "invalid block_structure " + v.dump() + " (expected [rows, cols])");
      dims.push_back(v[i].get<int64_t>());
    }
  } else {
    throw Error(where, "expected [rows, cols] or \"RxC\", got " + json_type_name(v));
  }
  if (dims.size() != 2)
    throw Error(where, "invalid block_structure " + v.dump() + " (expected [rows, cols])");
  if (dims[0] <= 0 || dims[1] <= 0)
    throw Error(where, "block_structure " + v.dump() + " must be positive");
  return {dims[0], dims[1]};
}

DynamicMode parse_dynamic(const Json& j, const std::string& where) {
  auto it = j.find("dynamic");
  if (it == j.end() || it->is_null()) return DynamicMode::kStatic;
  const std::string kw = key_where(where, "dynamic");
  if (it->is_boolean()) return it->get<bool>() ? DynamicMode::kDynamic : DynamicMode::kStatic;
  if (it->is_string()) {
    if (lower(it->get<std::string>()) == "local") return DynamicMode::kLocal;
    throw Error(kw, "expected true, false or \"local\", got '" + it->get<std::string>() + "'");
  }
  throw Error(kw, "expected true, false or \"local\", got " + json_type_name(*it));
}

ActOrder parse_actorder(const Json& j, const std::string& where) {
  auto it = j.find("actorder");
  if (it == j.end() || it->is_null()) return ActOrder::kNone;
  const std::string kw = key_where(where, "actorder");
  if (it->is_boolean()) return it->get<bool>() ? ActOrder::kGroup : ActOrder::kNone;
  if (it->is_string()) {
    const std::string s = lower(it->get<std::string>());
    if (s == "group" || s == "dynamic") return ActOrder::kGroup;
    if (s == "weight" || s == "static") return ActOrder::kWeight;
    throw Error(kw, "unknown actorder '" + it->get<std::string>() +
                        "' (known: group, weight, and the aliases dynamic, static)");
  }
  throw Error(kw, "expected a string, a boolean or null, got " + json_type_name(*it));
}

}  // namespace

std::string_view to_string(QuantType t) {
  switch (t) {
    case QuantType::kInt:
      return "int";
    case QuantType::kFloat:
      return "float";
  }
  return "?";
}

std::string_view to_string(QuantStrategy s) {
  switch (s) {
    case QuantStrategy::kTensor:
      return "tensor";
    case QuantStrategy::kChannel:
      return "channel";
    case QuantStrategy::kGroup:
      return "group";
    case QuantStrategy::kBlock:
      return "block";
    case QuantStrategy::kToken:
      return "token";
    case QuantStrategy::kTensorGroup:
      return "tensor_group";
    case QuantStrategy::kAttnHead:
      return "attn_head";
  }
  return "?";
}

std::string_view to_string(DynamicMode d) {
  switch (d) {
    case DynamicMode::kStatic:
      return "static";
    case DynamicMode::kDynamic:
      return "dynamic";
    case DynamicMode::kLocal:
      return "local";
  }
  return "?";
}

std::string_view to_string(ActOrder a) {
  switch (a) {
    case ActOrder::kNone:
      return "none";
    case ActOrder::kGroup:
      return "group";
    case ActOrder::kWeight:
      return "weight";
  }
  return "?";
}

int64_t QuantArgs::effective_group_size() const {
  if (strategy == QuantStrategy::kGroup || strategy == QuantStrategy::kTensorGroup)
    return group_size.value_or(0);
  return 0;
}

QuantArgs parse_quant_args(const Json& j, const std::string& where) {
  require_object(j, where);
  QuantArgs a;

  if (auto t = opt_string(j, "type", where)) {
    const std::string s = lower(*t);
    if (s == "int")
      a.type = QuantType::kInt;
    else if (s == "float")
      a.type = QuantType::kFloat;
    else
      throw Error(key_where(where, "type"), "expected 'int' or 'float', got '" + *t + "'");
  }
  const int64_t bits = opt_int(j, "num_bits", where).value_or(8);
  if (a.type == QuantType::kFloat && bits != 4 && bits != 8)
    throw Error(key_where(where, "num_bits"),
                "float quantization supports 4 or 8 bits, got " + std::to_string(bits));
  if (bits < 1 || bits > 32)
    throw Error(key_where(where, "num_bits"), "must be in [1, 32], got " + std::to_string(bits));
  a.num_bits = static_cast<int>(bits);
  a.symmetric = opt_bool(j, "symmetric", where).value_or(true);

  a.group_size = opt_int(j, "group_size", where);
  if (a.group_size && *a.group_size < -1)
    throw Error(key_where(where, "group_size"),
                "invalid group size " + std::to_string(*a.group_size) +
                    " (use > 0 for strategy 'group' and -1 for 'channel')");

  std::optional<QuantStrategy> strategy;
  if (auto s = opt_string(j, "strategy", where)) {
    const std::string name = lower(*s);
    for (QuantStrategy cand : kStrategies)
      if (to_string(cand) == name) strategy = cand;
    if (!strategy)
      throw Error(key_where(where, "strategy"),
                  "unknown strategy '" + *s +
                      "' (known: tensor, channel, group, block, token, tensor_group, attn_head)");
  }
  if (auto it = j.find("block_structure"); it != j.end() && !it->is_null())
    a.block_structure = parse_block_structure(*it, key_where(where, "block_structure"));
  a.dynamic = parse_dynamic(j, where);
  a.actorder = parse_actorder(j, where);
  a.scale_dtype = parse_torch_dtype(j, "scale_dtype", where);
  a.zp_dtype = parse_torch_dtype(j, "zp_dtype", where);
  if (a.symmetric) a.zp_dtype.reset();  // the library serializes it as null when symmetric

  // Strategy inference, as QuantizationArgs.validate_model_after does it.
  if (!strategy) {
    if (!a.group_size)
      strategy = QuantStrategy::kTensor;
    else if (*a.group_size > 0)
      strategy = QuantStrategy::kGroup;
    else if (*a.group_size == -1)
      strategy = QuantStrategy::kChannel;
    else
      throw Error(key_where(where, "group_size"),
                  "invalid group size 0 (use > 0 for strategy 'group' and -1 for 'channel')");
  }
  a.strategy = *strategy;
  const std::string sname(to_string(a.strategy));

  if (a.strategy == QuantStrategy::kToken && !a.is_dynamic())
    throw Error(where, "strategy 'token' requires dynamic quantization (dynamic: true)");
  const bool grouped =
      a.strategy == QuantStrategy::kGroup || a.strategy == QuantStrategy::kTensorGroup;
  if (grouped && (!a.group_size || *a.group_size <= 0))
    throw Error(where, "strategy '" + sname + "' requires a positive group_size");
  if (!grouped && a.group_size && *a.group_size > 0)
    throw Error(where, "group_size " + std::to_string(*a.group_size) +
                           " requires strategy 'group' or 'tensor_group', got '" + sname + "'");
  if (a.strategy == QuantStrategy::kBlock && !a.block_structure)
    throw Error(where, "strategy 'block' requires block_structure");
  if (a.strategy != QuantStrategy::kBlock && a.block_structure)
    throw Error(where, "block_structure requires strategy 'block', got '" + sname + "'");
  if (a.actorder == ActOrder::kGroup && !grouped)
    throw Error(
        where, "actorder 'group' requires strategy 'group' or 'tensor_group', got '" + sname + "'");
  if (a.is_dynamic()) {
    if (!grouped && a.strategy != QuantStrategy::kToken && a.strategy != QuantStrategy::kTensor)
      throw Error(where,
                  "dynamic quantization needs strategy token, tensor, group or "
                  "tensor_group, got '" +
                      sname + "'");
    if (a.dynamic == DynamicMode::kLocal && a.strategy != QuantStrategy::kTensorGroup)
      throw Error(where, "dynamic \"local\" is only supported for strategy 'tensor_group', got '" +
                             sname + "'");
  }
  return a;
}

Json to_json(const QuantArgs& a) {
  Json j = {
      {"num_bits", a.num_bits},
      {"type", std::string(to_string(a.type))},
      {"symmetric", a.symmetric},
      {"strategy", std::string(to_string(a.strategy))},
      {"group_size", a.group_size ? Json(*a.group_size) : Json(nullptr)},
      {"block_structure", a.block_structure ? Json(*a.block_structure) : Json(nullptr)},
      {"actorder",
       a.actorder == ActOrder::kNone ? Json(nullptr) : Json(std::string(to_string(a.actorder)))},
      {"scale_dtype", a.scale_dtype ? Json(*a.scale_dtype) : Json(nullptr)},
      {"zp_dtype", a.zp_dtype ? Json(*a.zp_dtype) : Json(nullptr)},
  };
  switch (a.dynamic) {
    case DynamicMode::kStatic:
      j["dynamic"] = false;
      break;
    case DynamicMode::kDynamic:
      j["dynamic"] = true;
      break;
    case DynamicMode::kLocal:
      j["dynamic"] = "local";
      break;
  }
  return j;
}

std::string describe(const QuantArgs& a) {
  std::string s = std::string(to_string(a.type)) + std::to_string(a.num_bits) + " " +
                  std::string(to_string(a.strategy));
  if (a.effective_group_size() > 0) s += "(" + std::to_string(a.effective_group_size()) + ")";
  if (a.block_structure)
    s += "(" + std::to_string((*a.block_structure)[0]) + "x" +
         std::to_string((*a.block_structure)[1]) + ")";
  s += a.symmetric ? " sym " : " asym ";
  s += to_string(a.dynamic);
  if (a.actorder != ActOrder::kNone) s += " actorder=" + std::string(to_string(a.actorder));
  if (a.scale_dtype) s += " scale_dtype=" + *a.scale_dtype;
  return s;
}

}  // namespace qparity
