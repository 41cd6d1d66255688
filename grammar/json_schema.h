// JSON Schema -> grammar: the texts the grammar allows are JSON documents that validate against
// the schema. Supported (everything else is a GrammarError naming the keyword's path, never
// silently ignored):
//   type (a name or a list), enum, const, properties, required, additionalProperties (false;
//   a schema or true for objects without properties), items, prefixItems, minItems, maxItems,
//   string minLength / maxLength / pattern / format (date, time, date-time, uuid, email, ipv4),
//   integer minimum / maximum / exclusive*, number bounds that are integers, anyOf, allOf (merged
//   keyword by keyword when they do not conflict), oneOf (when its alternatives cannot overlap:
//   different JSON types, or objects told apart by a required property's const), $ref to
//   "#", "#/$defs/..", "#/definitions/.." (recursion becomes a grammar rule), nullable: true, and
//   the annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
//   readOnly, writeOnly).
// The generated text is a subset of what validates, chosen to be compact and bounded:
//   - properties come in schema order; properties not listed are not generated;
//   - no whitespace except one optional space after ':' and ',' (json.dumps' separators);
//   - integers have at most 15 digits, numbers at most 15 digits before and after the point and
//     a 2-digit exponent (bounded numbers: no exponent).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace m3::grammar {

struct JsonSchemaOptions {
  std::string what = "json_schema";  // the prefix of keyword paths in errors
  // A code point strings never hold as such (0: none): in tool-call markup a value must not spell
  // markup, so M3 keeps out ']' (its namespace marker) and M2 '<' (its tags). A JSON string may
  // still spell it as a \u escape.
  uint32_t excluded_char = 0;
};

// Adds the rules for values of `schema` to `g` and returns the node of a value.
class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(Grammar& g, const nlohmann::ordered_json& root, JsonSchemaOptions options);
  ~JsonSchemaCompiler();
  // A JSON value that validates against `schema` (a node of the root document); `path` names it.
  int32_t value(const nlohmann::ordered_json& schema, const std::string& path);
  // The text of a string that validates (without quotes, not escaped: tool-call raw values).
  int32_t raw_string(const nlohmann::ordered_json& schema, const std::string& path);
  // Any JSON value / any JSON object (json_object).
  int32_t any_value();
  int32_t any_object();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A grammar whose start rule is one value of `schema`.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace m3::grammar
