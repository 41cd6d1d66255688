// Turning the text of a tool-call parameter into the JSON value the tool's schema asks for.
//
// Tool-call markup carries every value as text (M2: `<parameter name="k">v</parameter>`, objects
// and arrays as JSON text) or as nested elements (M3: objects as child tags, arrays as <item>
// children, null values omitted). The rules, applied per value with the schema of that value:
//
//  - Allowed types come from `type` (a name or a list), `anyOf`/`oneOf` (union), `allOf`,
//    `enum`/`const` (the types of their members), `nullable: true`, or are implied by
//    `properties`/`additionalProperties` (object) and `items`/`prefixItems` (array). Local
//    `$ref`s ("#/$defs/X", "#/definitions/X") are followed.
//  - A schema that allows only strings keeps the text exactly (no trimming).
//  - Otherwise the text, trimmed of JSON whitespace, becomes the first of these that the schema
//    allows and that parses: null ("null", any case), boolean ("true"/"false", any case),
//    integer (optional '-', digits, leading zeros allowed; or a number with an integral value
//    below 2^53), number (JSON number syntax, leading zeros allowed, finite), object (a JSON
//    object text), array (a JSON array text). Empty text is "" when strings are allowed, else
//    {} / [] / null as allowed (the M3 template renders an empty object or array as nothing).
//  - A schema without any type information (e.g. `{}`) takes the trimmed text as JSON when it
//    parses as JSON, else the text as a string.
//  - Nothing fits, or no schema is known (unknown tool or parameter): the text as a string,
//    unchanged. The model's text is never lost.
//  - Nested elements become an array when the schema allows arrays and either all children are
//    <item> or objects are not allowed; else an object when allowed (repeated child names fold
//    into an array, each coerced with the property's `items` schema when it is an array). With
//    no schema: an array when all children are <item>, else an object. Elements mixed with
//    non-whitespace text, or elements where only scalars are allowed, keep their raw text (the
//    text of the element and its children; the parser leaves markup out of it).
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::text {

// One parameter (or nested element) of M3 tool-call markup.
struct MarkupElement {
  std::string name;
  std::string raw;                      // inner text as generated, children's text included, markup left out
  std::vector<MarkupElement> children;  // nested elements; empty for a leaf value
  bool has_text = false;                // non-whitespace text outside the children
};

// A node of a tool's parameter schema and the document its local "$ref"s resolve against.
struct SchemaNode {
  const nlohmann::json* node = nullptr;  // nullptr: nothing is known about this value
  const nlohmann::json* root = nullptr;
};

// The parameter schemas of a request's tools.
class ToolSchemas {
 public:
  ToolSchemas() = default;
  // `tools`: the request's OpenAI `tools` array ({"type":"function","function":{"name",
  // "parameters"}}; a bare {"name","parameters"} is accepted too), or null. Throws m3::Error
  // naming the entry when a tool has no name.
  explicit ToolSchemas(const nlohmann::json& tools);

  bool has_tool(std::string_view tool) const;
  // The schema of one top-level parameter; node is nullptr for an unknown tool or parameter.
  SchemaNode parameter(std::string_view tool, std::string_view param) const;

 private:
  std::map<std::string, nlohmann::json, std::less<>> parameters_;  // tool name -> `parameters`
};

// True when the schema allows JSON strings and nothing else (such values stream as they arrive).
bool allows_only_strings(SchemaNode schema);

nlohmann::ordered_json coerce_text(SchemaNode schema, std::string_view text);
nlohmann::ordered_json coerce_element(SchemaNode schema, const MarkupElement& element);

// Appends `raw` to `out` escaped as the inside of a JSON string, byte for byte the way
// nlohmann::json::dump escapes (UTF-8 passes through; control characters are escaped).
void append_json_string_body(std::string& out, std::string_view raw);

// `value` as compact JSON text; invalid UTF-8 is replaced, never thrown on.
std::string to_json_text(const nlohmann::ordered_json& value);

}  // namespace m3::text
