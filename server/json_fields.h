// Typed reads of request fields with OpenAI-style leniency: a missing field and an explicit null
// both mean "not given". A field of the wrong type is a 400 ApiError naming the field and the
// type received, so clients learn exactly what to fix.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace m3::server {

// Request bodies keep the client's key order: chat templates print tool schemas with `tojson`,
// and the prompt should show them as sent.
using Json = nlohmann::ordered_json;

// The JSON type name as a client would say it: "string", "integer", "number", "object", ...
std::string_view json_type_name(const Json& value);

// `path` names the field in messages (e.g. "stream_options.include_usage"); `key` is looked up
// in `object`, which must be a JSON object.
std::optional<std::string> read_string(const Json& object, std::string_view key,
                                       std::string_view path = {});
std::optional<bool> read_bool(const Json& object, std::string_view key, std::string_view path = {});
// Integers: JSON integers, or floats with an integral value (2.0), as Python's pydantic accepts.
std::optional<int64_t> read_int(const Json& object, std::string_view key,
                                std::string_view path = {});
// Finite numbers only (NaN/Inf cannot appear in strict JSON, but be explicit).
std::optional<double> read_number(const Json& object, std::string_view key,
                                  std::string_view path = {});
// A JSON object field; nullptr when missing or null.
const Json* read_object(const Json& object, std::string_view key, std::string_view path = {});
const Json* read_array(const Json& object, std::string_view key, std::string_view path = {});

// Value-level checks for elements of arrays ("stop[1]").
int64_t as_int(const Json& value, std::string_view path);
const std::string& as_string(const Json& value, std::string_view path);

}  // namespace m3::server
