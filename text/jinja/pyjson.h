// JSON in and out of template values: inputs arrive as JSON (messages, tools, kwargs), and
// transformers' `tojson` filter is Python's json.dumps, whose exact spacing, escaping and float
// formatting a chat template's output depends on.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace m3::jinja {

// Objects keep their key order; integers stay integers, numbers with a fraction or exponent
// become floats, as json.loads gives them. Strings are borrowed: the JSON must outlive the value.
Value from_json(const nlohmann::ordered_json& json);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // None: one line
  std::optional<std::string> item_separator, key_separator;  // None: Python's defaults
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// json.dumps(value, ...). Raises TypeError for values JSON cannot hold (Undefined, objects).
std::string json_dumps(const Value& value, const JsonDumpOptions& options);

}  // namespace m3::jinja
