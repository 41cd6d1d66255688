#include "server/json_fields.h"

#include <cmath>

#include "server/api_error.h"

namespace m3::server {
namespace {

const Json* find_field(const Json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string_view name_of(std::string_view key, std::string_view path) {
  return path.empty() ? key : path;
}

[[noreturn]] void wrong_type(std::string_view field, std::string_view expected, const Json& value) {
  bad_field(field, "must be {}, got {}", expected, json_type_name(value));
}

}  // namespace

std::string_view json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::string:
      return "string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    default:
      return "unsupported value";
  }
}

int64_t as_int(const Json& value, std::string_view path) {
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) bad_field(path, "is out of range: {}", u);
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    double d = value.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  wrong_type(path, "an integer", value);
}

const std::string& as_string(const Json& value, std::string_view path) {
  if (!value.is_string()) wrong_type(path, "a string", value);
  return value.get_ref<const std::string&>();
}

std::optional<std::string> read_string(const Json& object, std::string_view key,
                                       std::string_view path) {
  const Json* value = find_field(object, key);
  if (!value) return std::nullopt;
  return as_string(*value, name_of(key, path));
}

std::optional<bool> read_bool(const Json& object, std::string_view key, std::string_view path) {
  const Json* value = find_field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) wrong_type(name_of(key, path), "a boolean", *value);
  return value->get<bool>();
}

std::optional<int64_t> read_int(const Json& object, std::string_view key, std::string_view path) {
  const Json* value = find_field(object, key);
  if (!value) return std::nullopt;
  return as_int(*value, name_of(key, path));
}

std::optional<double> read_number(const Json& object, std::string_view key, std::string_view path) {
  const Json* value = find_field(object, key);
  if (!value) return std::nullopt;
  if (!value->is_number()) wrong_type(name_of(key, path), "a number", *value);
  double d = value->get<double>();
  if (!std::isfinite(d)) bad_field(name_of(key, path), "must be a finite number");
  return d;
}

const Json* read_object(const Json& object, std::string_view key, std::string_view path) {
  const Json* value = find_field(object, key);
  if (value && !value->is_object()) wrong_type(name_of(key, path), "an object", *value);
  return value;
}

const Json* read_array(const Json& object, std::string_view key, std::string_view path) {
  const Json* value = find_field(object, key);
  if (value && !value->is_array()) wrong_type(name_of(key, path), "an array", *value);
  return value;
}

}  // namespace m3::server
