#include "core/json_util.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qparity {

Json read_json_file(const std::filesystem::path& path) {
  // A FIFO or device would block or never end: only regular files are read.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw Error(path.string(), "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string(), "cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw Error(path.string(), "read error");
  return parse_json_text(buf.str(), path.string());
}

Json parse_json_text(std::string_view text, const std::string& where) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for numbers beyond double (found by fuzzing: "1e616").
    throw Error(where, "invalid JSON: " + json_error_text(e));
  }
}

std::string json_error_text(const Json::exception& e) {
  // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep position and reason.
  std::string msg = e.what();
  const auto close = msg.find("] ");
  return close == std::string::npos ? msg : msg.substr(close + 2);
}

std::string key_where(const std::string& where, std::string_view key) {
  return where + ": key '" + std::string(key) + "'";
}

std::string json_type_name(const Json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

void require_object(const Json& v, const std::string& where) {
  if (!v.is_object()) throw Error(where, "expected a JSON object, got " + json_type_name(v));
}

const Json& require_key(const Json& obj, std::string_view key, const std::string& where) {
  require_object(obj, where);
  auto it = obj.find(key);
  if (it == obj.end()) throw Error(where, "missing required key '" + std::string(key) + "'");
  return *it;
}

int64_t as_int(const Json& v, const std::string& where) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw Error(where, "integer out of range");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    // HF configs occasionally write integral values as 4096.0; accept exactly integral floats.
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e15)
      return static_cast<int64_t>(d);
    throw Error(where, "expected an integer, got " + v.dump());
  }
  throw Error(where, "expected an integer, got " + json_type_name(v));
}

double as_number(const Json& v, const std::string& where) {
  if (!v.is_number()) throw Error(where, "expected a number, got " + json_type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw Error(where, "expected a finite number");
  return d;
}

bool as_bool(const Json& v, const std::string& where) {
  if (!v.is_boolean()) throw Error(where, "expected true or false, got " + json_type_name(v));
  return v.get<bool>();
}

std::string as_string(const Json& v, const std::string& where) {
  if (!v.is_string()) throw Error(where, "expected a string, got " + json_type_name(v));
  return v.get<std::string>();
}

std::vector<std::string> as_string_list(const Json& v, const std::string& where) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
    return out;
  }
  if (!v.is_array()) throw Error(where, "expected a list of strings, got " + json_type_name(v));
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(as_string(v[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

namespace {
const Json* find_present(const Json& obj, std::string_view key, const std::string& where) {
  require_object(obj, where);
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<int64_t> opt_int(const Json& obj, std::string_view key, const std::string& where) {
  const Json* v = find_present(obj, key, where);
  if (!v) return std::nullopt;
  return as_int(*v, key_where(where, key));
}
std::optional<double> opt_number(const Json& obj, std::string_view key, const std::string& where) {
  const Json* v = find_present(obj, key, where);
  if (!v) return std::nullopt;
  return as_number(*v, key_where(where, key));
}
std::optional<bool> opt_bool(const Json& obj, std::string_view key, const std::string& where) {
  const Json* v = find_present(obj, key, where);
  if (!v) return std::nullopt;
  return as_bool(*v, key_where(where, key));
}
std::optional<std::string> opt_string(const Json& obj, std::string_view key,
                                      const std::string& where) {
  const Json* v = find_present(obj, key, where);
  if (!v) return std::nullopt;
  return as_string(*v, key_where(where, key));
}

}  // namespace qparity
