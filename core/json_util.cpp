#include "core/json_util.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"

namespace qparity {

Json read_json_file(const std::filesystem::path& path) {
  // A FIFO or device would block or never end: only regular files are read (input_file.h).
  return parse_json_text(read_input_file(path, "JSON file"), path.string());
}

Json parse_json_text(std::string_view text, const std::string& where) {
  // Duplicate keys are refused at any depth: nlohmann (like Python's json) keeps the last value,
  // so a policy gate written twice, loosened the second time, would be taken silently.
  struct Open {
    std::set<std::string> keys;
    std::string path;  // "engine.default.points[]"
  };
  std::vector<Open> open;
  std::vector<bool> in_array;  // per open container: an array (its elements' paths get "[]")
  std::string last_key, duplicate, duplicate_in;
  auto child_path = [&]() {
    const std::string parent = open.empty() ? "" : open.back().path;
    if (!in_array.empty() && in_array.back()) return parent + "[]";
    if (open.empty()) return std::string();
    return parent.empty() ? last_key : parent + "." + last_key;
  };
  auto cb = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open.push_back({{}, child_path()});
        in_array.push_back(false);
        break;
      case Json::parse_event_t::array_start:
        open.push_back({{}, child_path()});
        in_array.push_back(true);
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        if (!in_array.empty()) in_array.pop_back();
        break;
      case Json::parse_event_t::key:
        last_key = parsed.get_ref<const std::string&>();
        if (!open.empty() && !open.back().keys.insert(last_key).second && duplicate.empty()) {
          duplicate = last_key;
          duplicate_in = open.back().path;
        }
        break;
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), cb);
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for numbers beyond double (found by fuzzing: "1e616").
    throw Error(where, "invalid JSON: " + json_error_text(e));
  }
  if (!duplicate.empty())
    throw Error(where, "duplicate key '" + duplicate + "'" +
                           (duplicate_in.empty() ? std::string(" at the top level")
                                                 : " in '" + duplicate_in + "'") +
                           " (JSON readers disagree on which value wins; give each key once)");
  return j;
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
