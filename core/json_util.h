#pragma once
// Typed access to JSON documents with errors that name the file and the key. Every parser in
// qparity goes through these so that "config.json: key 'num_attention_heads': expected an
// integer, got string" is the shape of every message.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qparity {

using Json = nlohmann::json;

// Reads and parses a JSON file; errors name the file and the parse position.
Json read_json_file(const std::filesystem::path& path);
// Parses text that came from `where` (a file name, or "file: section").
Json parse_json_text(std::string_view text, const std::string& where);

// nlohmann's message without its exception-id prefix.
std::string json_error_text(const Json::exception& e);

// "key 'a.b'" style location used in messages.
std::string key_where(const std::string& where, std::string_view key);
std::string json_type_name(const Json& v);

const Json& require_key(const Json& obj, std::string_view key, const std::string& where);
void require_object(const Json& v, const std::string& where);

int64_t as_int(const Json& v, const std::string& where);
double as_number(const Json& v, const std::string& where);
bool as_bool(const Json& v, const std::string& where);
std::string as_string(const Json& v, const std::string& where);
std::vector<std::string> as_string_list(const Json& v, const std::string& where);

// Optional fields: absent and null both mean "not given".
std::optional<int64_t> opt_int(const Json& obj, std::string_view key, const std::string& where);
std::optional<double> opt_number(const Json& obj, std::string_view key, const std::string& where);
std::optional<bool> opt_bool(const Json& obj, std::string_view key, const std::string& where);
std::optional<std::string> opt_string(const Json& obj, std::string_view key,
                                      const std::string& where);

}  // namespace qparity
