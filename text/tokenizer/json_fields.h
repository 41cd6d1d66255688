// Reading tokenizer.json fields with errors that name the file, the component path and the field.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace m3::text::json_fields {

using Json = nlohmann::json;

// The member `key` of the object `obj`; throws "<where>: missing field 'key'" when absent.
const Json& require(const Json& obj, std::string_view key, std::string_view where);
// The component's "type" tag.
std::string type_of(const Json& obj, std::string_view where);
std::string get_string(const Json& obj, std::string_view key, std::string_view where);
// Absent or null gives nullopt.
std::optional<std::string> get_optional_string(const Json& obj, std::string_view key,
                                               std::string_view where);
bool get_bool(const Json& obj, std::string_view key, std::string_view where, bool fallback);
int64_t get_int(const Json& obj, std::string_view key, std::string_view where, int64_t fallback);
// A `{"String": s}` or `{"Regex": r}` pattern; sets *is_regex.
std::string get_pattern(const Json& obj, std::string_view key, std::string_view where,
                        bool* is_regex);

}  // namespace m3::text::json_fields
