#include "text/json_schema_coerce.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace m3::text {
namespace {

using ojson = nlohmann::ordered_json;

enum TypeBits : unsigned {
  kString = 1u << 0,
  kInteger = 1u << 1,
  kNumber = 1u << 2,
  kBoolean = 1u << 3,
  kObject = 1u << 4,
  kArray = 1u << 5,
  kNull = 1u << 6,
  kAnyType = (1u << 7) - 1,
};

// Guards $ref cycles and absurd nesting in request-supplied schemas.
constexpr int kMaxSchemaDepth = 32;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char x = a[i] >= 'A' && a[i] <= 'Z' ? char(a[i] - 'A' + 'a') : a[i];
    if (x != b[i]) return false;
  }
  return true;
}

// Type names as JSON Schema spells them, plus the loose aliases tool authors write.
unsigned type_bit(std::string_view name) {
  if (name == "string" || name == "str" || name == "text") return kString;
  if (name == "integer" || name == "int" || name == "long") return kInteger;
  if (name == "number" || name == "float" || name == "double") return kNumber;
  if (name == "boolean" || name == "bool") return kBoolean;
  if (name == "object" || name == "dict" || name == "map") return kObject;
  if (name == "array" || name == "list") return kArray;
  if (name == "null") return kNull;
  return 0;
}

unsigned value_type_bit(const nlohmann::json& v) {
  if (v.is_string()) return kString;
  if (v.is_number_integer()) return kInteger;
  if (v.is_number()) return kNumber;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  return kNull;
}

// Follows local "$ref"s; returns the node itself when it has none or it cannot be resolved.
SchemaNode resolve(SchemaNode s, int depth = 0) {
  while (s.node && s.node->is_object() && depth++ < kMaxSchemaDepth) {
    const auto ref = s.node->find("$ref");
    if (ref == s.node->end() || !ref->is_string()) break;
    const std::string& target = ref->get_ref<const std::string&>();
    if (!target.starts_with('#') || !s.root) break;
    const nlohmann::json* next = nullptr;
    try {
      const nlohmann::json::json_pointer pointer(target.substr(1));
      if (s.root->contains(pointer)) next = &s.root->at(pointer);
    } catch (const nlohmann::json::exception&) {
      next = nullptr;
    }
    if (!next) break;
    s.node = next;
  }
  return s;
}

const nlohmann::json* member(const nlohmann::json& node, std::string_view key) {
  if (!node.is_object()) return nullptr;
  const auto it = node.find(key);
  return it == node.end() ? nullptr : &*it;
}

// The JSON types a schema node allows (kAnyType when it says nothing about types).
unsigned allowed_types(SchemaNode s, int depth = 0) {
  s = resolve(s);
  if (!s.node || !s.node->is_object() || depth > kMaxSchemaDepth) return kAnyType;
  const nlohmann::json& node = *s.node;
  unsigned bits = 0;
  bool constrained = false;
  if (const auto* type = member(node, "type")) {
    constrained = true;
    if (type->is_string()) bits |= type_bit(type->get_ref<const std::string&>());
    if (type->is_array()) {
      for (const auto& t : *type) {
        if (t.is_string()) bits |= type_bit(t.get_ref<const std::string&>());
      }
    }
    if (bits == 0) return kAnyType;  // only type names nobody knows: assume nothing
  } else {
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      const auto* alternatives = member(node, key);
      if (!alternatives || !alternatives->is_array()) continue;
      for (const auto& alternative : *alternatives) {
        const unsigned alt = allowed_types({&alternative, s.root}, depth + 1);
        if (alt != kAnyType || std::string_view(key) != "allOf") {
          constrained = true;
          bits |= alt;
        }
      }
    }
    if (!constrained) {
      if (const auto* values = member(node, "enum"); values && values->is_array()) {
        constrained = true;
        for (const auto& v : *values) bits |= value_type_bit(v);
      } else if (const auto* value = member(node, "const")) {
        constrained = true;
        bits |= value_type_bit(*value);
      } else if (member(node, "properties") || member(node, "additionalProperties")) {
        constrained = true;
        bits |= kObject;
      } else if (member(node, "items") || member(node, "prefixItems")) {
        constrained = true;
        bits |= kArray;
      }
    }
  }
  if (const auto* nullable = member(node, "nullable"); nullable && nullable->is_boolean() && nullable->get<bool>()) {
    bits |= kNull;
  }
  return constrained && bits != 0 ? bits : kAnyType;
}

// The branch of a union (or the node itself) that describes values of type `bit`.
SchemaNode branch_for(SchemaNode s, unsigned bit, int depth = 0) {
  s = resolve(s);
  if (!s.node || !s.node->is_object() || depth > kMaxSchemaDepth) return s;
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    const auto* alternatives = member(*s.node, key);
    if (!alternatives || !alternatives->is_array()) continue;
    for (const auto& alternative : *alternatives) {
      const SchemaNode alt{&alternative, s.root};
      if (allowed_types(alt, depth + 1) & bit) {
        const SchemaNode found = branch_for(alt, bit, depth + 1);
        const bool describes = bit == kObject ? member(*found.node, "properties") || member(*found.node, "additionalProperties")
                                              : member(*found.node, "items") || member(*found.node, "prefixItems");
        if (describes || std::string_view(key) != "allOf") return found;
      }
    }
  }
  return s;
}

SchemaNode property_schema(SchemaNode object, std::string_view name) {
  if (!object.node) return {};
  const SchemaNode s = branch_for(object, kObject);
  if (const auto* properties = member(*s.node, "properties"); properties && properties->is_object()) {
    if (const auto* p = member(*properties, name)) return {p, s.root};
  }
  if (const auto* extra = member(*s.node, "additionalProperties"); extra && extra->is_object()) {
    return {extra, s.root};
  }
  return {};
}

SchemaNode items_schema(SchemaNode array, std::size_t index) {
  if (!array.node) return {};
  const SchemaNode s = branch_for(array, kArray);
  if (const auto* prefix = member(*s.node, "prefixItems"); prefix && prefix->is_array() && index < prefix->size()) {
    return {&(*prefix)[index], s.root};
  }
  if (const auto* items = member(*s.node, "items")) {
    if (items->is_object()) return {items, s.root};
    if (items->is_array() && index < items->size()) return {&(*items)[index], s.root};
  }
  return {};
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// JSON number syntax, except that leading zeros are allowed.
bool looks_like_number(std::string_view t) {
  if (t.starts_with('-')) t.remove_prefix(1);
  const std::size_t int_end = t.find_first_not_of("0123456789");
  std::string_view digits = t.substr(0, int_end);
  if (digits.empty()) return false;
  t.remove_prefix(digits.size());
  if (t.starts_with('.')) {
    t.remove_prefix(1);
    const std::size_t n = std::min(t.find_first_not_of("0123456789"), t.size());
    if (n == 0) return false;
    t.remove_prefix(n);
  }
  if (t.starts_with('e') || t.starts_with('E')) {
    t.remove_prefix(1);
    if (t.starts_with('+') || t.starts_with('-')) t.remove_prefix(1);
    if (!all_digits(t)) return false;
    t = {};
  }
  return t.empty();
}

bool parse_integer(std::string_view t, ojson& out) {
  const bool negative = t.starts_with('-');
  if (all_digits(negative ? t.substr(1) : t)) {
    std::int64_t i = 0;
    if (auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), i); ec == std::errc() && p == t.data() + t.size()) {
      out = i;
      return true;
    }
    std::uint64_t u = 0;
    if (!negative) {
      if (auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), u); ec == std::errc() && p == t.data() + t.size()) {
        out = u;
        return true;
      }
    }
    return false;
  }
  // An integral value written as a float ("5.0", "1e3") is an integer in JSON Schema.
  if (!looks_like_number(t)) return false;
  double d = 0;
  if (auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), d); ec != std::errc() || p != t.data() + t.size()) {
    return false;
  }
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) >= 9007199254740992.0) return false;
  out = static_cast<std::int64_t>(d);
  return true;
}

bool parse_number(std::string_view t, ojson& out) {
  if (!looks_like_number(t)) return false;
  if (t.find_first_of(".eE") == std::string_view::npos && parse_integer(t, out)) return true;
  double d = 0;
  if (auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), d); ec != std::errc() || p != t.data() + t.size()) {
    return false;
  }
  if (!std::isfinite(d)) return false;
  out = d;
  return true;
}

// Nesting deeper than this is not taken as JSON (the text stays a string): the value is walked
// recursively later (coercion, serialization), and model output must not exhaust the stack.
constexpr int kMaxJsonTextDepth = 128;

bool parse_json_text(std::string_view t, ojson& out) {
  if (t.empty()) return false;
  bool too_deep = false;
  // The callback sees each container start at its depth; returning false there discards the
  // rest, and too_deep rejects the whole text.
  auto limit_depth = [&](int depth, ojson::parse_event_t event, ojson&) {
    if ((event == ojson::parse_event_t::object_start || event == ojson::parse_event_t::array_start) &&
        depth > kMaxJsonTextDepth) {
      too_deep = true;
      return false;
    }
    return !too_deep;
  };
  ojson parsed = ojson::parse(t.begin(), t.end(), limit_depth, /*allow_exceptions=*/false);
  if (too_deep || parsed.is_discarded()) return false;
  out = std::move(parsed);
  return true;
}

ojson coerce_children(SchemaNode schema, const MarkupElement& element) {
  const unsigned types = schema.node ? allowed_types(schema) : kObject | kArray;
  bool all_items = true;
  for (const auto& child : element.children) all_items = all_items && child.name == "item";

  if ((types & kArray) && (all_items || !(types & kObject))) {
    ojson array = ojson::array();
    for (std::size_t i = 0; i < element.children.size(); ++i) {
      array.push_back(coerce_element(items_schema(schema, i), element.children[i]));
    }
    return array;
  }
  if (!(types & kObject)) return element.raw;

  // Repeated names fold into one array, in the order the names first appear.
  std::vector<std::pair<std::string_view, std::vector<const MarkupElement*>>> groups;
  for (const auto& child : element.children) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == child.name; });
    if (it == groups.end()) {
      groups.push_back({child.name, {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(&child);
  }
  ojson object = ojson::object();
  for (const auto& [name, members] : groups) {
    const SchemaNode property = property_schema(schema, name);
    if (members.size() == 1) {
      object[std::string(name)] = coerce_element(property, *members.front());
      continue;
    }
    const bool property_is_array = property.node && (allowed_types(property) & kArray);
    ojson values = ojson::array();
    for (std::size_t i = 0; i < members.size(); ++i) {
      values.push_back(coerce_element(property_is_array ? items_schema(property, i) : property, *members[i]));
    }
    object[std::string(name)] = std::move(values);
  }
  return object;
}

}  // namespace

ToolSchemas::ToolSchemas(const nlohmann::json& tools) {
  if (tools.is_null()) return;
  M3_CHECK(tools.is_array(), "tools: expected an array of tool definitions, got {}", tools.type_name());
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::json& tool = tools[i];
    const nlohmann::json* function = member(tool, "function");
    if (!function || !function->is_object()) function = &tool;
    const nlohmann::json* name = member(*function, "name");
    M3_CHECK(name && name->is_string() && !name->get_ref<const std::string&>().empty(),
             "tools[{}]: a tool needs a non-empty string function.name", i);
    const nlohmann::json* parameters = member(*function, "parameters");
    parameters_.try_emplace(name->get<std::string>(), parameters ? *parameters : nlohmann::json::object());
  }
}

bool ToolSchemas::has_tool(std::string_view tool) const { return parameters_.find(tool) != parameters_.end(); }

SchemaNode ToolSchemas::parameter(std::string_view tool, std::string_view param) const {
  const auto it = parameters_.find(tool);
  if (it == parameters_.end()) return {};
  return property_schema({&it->second, &it->second}, param);
}

bool allows_only_strings(SchemaNode schema) { return schema.node && allowed_types(schema) == kString; }

ojson coerce_text(SchemaNode schema, std::string_view text) {
  if (!schema.node) return std::string(text);
  const unsigned types = allowed_types(schema);
  if (types == kString) return std::string(text);
  const std::string_view t = trim(text);
  ojson out;
  if (types == kAnyType) return parse_json_text(t, out) ? out : ojson(std::string(text));
  if (t.empty()) {
    if (types & kString) return std::string(text);
    if (types & kObject) return ojson::object();
    if (types & kArray) return ojson::array();
    if (types & kNull) return nullptr;
    return std::string(text);
  }
  if ((types & kNull) && iequals(t, "null")) return nullptr;
  if ((types & kBoolean) && (iequals(t, "true") || iequals(t, "false"))) return iequals(t, "true");
  if ((types & kInteger) && parse_integer(t, out)) return out;
  if ((types & kNumber) && parse_number(t, out)) return out;
  if ((types & kObject) && t.front() == '{' && parse_json_text(t, out) && out.is_object()) return out;
  if ((types & kArray) && t.front() == '[' && parse_json_text(t, out) && out.is_array()) return out;
  return std::string(text);
}

ojson coerce_element(SchemaNode schema, const MarkupElement& element) {
  if (element.children.empty()) return coerce_text(schema, element.raw);
  if (element.has_text) return element.raw;
  return coerce_children(schema, element);
}

void append_json_string_body(std::string& out, std::string_view raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : raw) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xF];
          out += kHex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
}

std::string to_json_text(const ojson& value) {
  return value.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace m3::text
