// The tools of the requests the parser tests pretend to serve, and helpers that write markup.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace m3::text::testing {

inline nlohmann::json test_tools() {
  return nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["c", "f"]}
      },
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "save_file", "parameters": {
      "type": "object",
      "properties": {"filename": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "create_order", "parameters": {
      "type": "object",
      "properties": {
        "user_id": {"type": "integer"},
        "urgent": {"type": "boolean"},
        "note": {"type": "string"},
        "price": {"type": "number"},
        "coupon": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "shipping": {"type": "object", "properties": {
          "city": {"type": "string"}, "zip": {"type": "integer"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {
          "sku": {"type": "string"}, "qty": {"type": "integer"}}}},
        "tags": {"type": "array", "items": {"type": "string"}},
        "metadata": {"type": "object", "additionalProperties": {"type": "integer"}},
        "options": {}
      }}}},
    {"type": "function", "function": {"name": "run", "parameters": {
      "type": "object", "properties": {"-A": {"type": "integer"}, "cmd": {"type": "string"}}}}}
  ])");
}

// M3 markup: every structural tag carries the namespace marker.
inline std::string m3_param(const std::string& name, const std::string& value) {
  const std::string ns = "]<]minimax[>[";
  return ns + "<" + name + ">" + value + ns + "</" + name + ">";
}

inline std::string m3_invoke(const std::string& function, const std::string& body) {
  const std::string ns = "]<]minimax[>[";
  return ns + "<invoke name=\"" + function + "\">" + body + ns + "</invoke>\n";
}

inline std::string m3_block(const std::string& invokes) {
  const std::string ns = "]<]minimax[>[";
  return ns + "<tool_call>\n" + invokes + ns + "</tool_call>";
}

inline std::string m2_param(const std::string& name, const std::string& value) {
  return "<parameter name=\"" + name + "\">" + value + "</parameter>\n";
}

inline std::string m2_invoke(const std::string& function, const std::string& body) {
  return "<invoke name=\"" + function + "\">\n" + body + "</invoke>\n";
}

inline std::string m2_block(const std::string& invokes) {
  return "<minimax:tool_call>\n" + invokes + "</minimax:tool_call>";
}

}  // namespace m3::text::testing
