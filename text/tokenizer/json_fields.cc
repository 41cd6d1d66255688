#include "text/tokenizer/json_fields.h"

#include "core/error.h"

namespace m3::text::json_fields {

namespace {
const char* kind_of(const Json& value) { return value.type_name(); }
}  // namespace

const Json& require(const Json& obj, std::string_view key, std::string_view where) {
  M3_CHECK(obj.is_object(), "{}: expected an object, found {}", where, kind_of(obj));
  const auto it = obj.find(key);
  M3_CHECK(it != obj.end(), "{}: missing field '{}'", where, key);
  return *it;
}

std::string type_of(const Json& obj, std::string_view where) {
  const Json& type = require(obj, "type", where);
  M3_CHECK(type.is_string(), "{}: field 'type' must be a string, found {}", where, kind_of(type));
  return type.get<std::string>();
}

std::string get_string(const Json& obj, std::string_view key, std::string_view where) {
  const Json& value = require(obj, key, where);
  M3_CHECK(value.is_string(), "{}: field '{}' must be a string, found {}", where, key,
           kind_of(value));
  return value.get<std::string>();
}

std::optional<std::string> get_optional_string(const Json& obj, std::string_view key,
                                               std::string_view where) {
  M3_CHECK(obj.is_object(), "{}: expected an object, found {}", where, kind_of(obj));
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  M3_CHECK(it->is_string(), "{}: field '{}' must be a string or null, found {}", where, key,
           kind_of(*it));
  return it->get<std::string>();
}

bool get_bool(const Json& obj, std::string_view key, std::string_view where, bool fallback) {
  M3_CHECK(obj.is_object(), "{}: expected an object, found {}", where, kind_of(obj));
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  M3_CHECK(it->is_boolean(), "{}: field '{}' must be true or false, found {}", where, key,
           kind_of(*it));
  return it->get<bool>();
}

int64_t get_int(const Json& obj, std::string_view key, std::string_view where, int64_t fallback) {
  M3_CHECK(obj.is_object(), "{}: expected an object, found {}", where, kind_of(obj));
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  M3_CHECK(it->is_number_integer(), "{}: field '{}' must be an integer, found {}", where, key,
           kind_of(*it));
  return it->get<int64_t>();
}

std::string get_pattern(const Json& obj, std::string_view key, std::string_view where,
                        bool* is_regex) {
  const Json& pattern = require(obj, key, where);
  M3_CHECK(pattern.is_object() && pattern.size() == 1,
           "{}: field '{}' must be {{\"String\": ...}} or {{\"Regex\": ...}}", where, key);
  const auto entry = pattern.begin();
  const std::string& kind = entry.key();
  const Json& value = entry.value();
  M3_CHECK(kind == "String" || kind == "Regex",
           "{}: field '{}' has unsupported pattern kind '{}' (expected String or Regex)", where,
           key, kind);
  M3_CHECK(value.is_string(), "{}: field '{}.{}' must be a string", where, key, kind);
  *is_regex = kind == "Regex";
  return value.get<std::string>();
}

}  // namespace m3::text::json_fields
