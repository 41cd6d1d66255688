// The grammar of a tool-call block in MiniMax-M3 markup (text/tool_parser.h is its reader; the
// chat template text/templates/minimax_m3.jinja writes the same layout):
//   NS"<tool_call>\n" invoke+ NS"</tool_call>"           (exactly one invoke when `parallel` is false)
//   invoke = NS"<invoke name=\"" NAME "\">" param* NS"</invoke>\n"
//   param  = NS"<" KEY ">" VALUE NS"</" KEY ">"           (the function's properties in schema order,
//                                                       every required one present)
// NS is the namespace marker. VALUE is written so that the parser's schema coercion
// (text/json_schema_coerce.h) gives back a value that validates against the property's schema:
//   - a property that allows only strings (or strings and null): the string itself, raw;
//   - any other property: its JSON text (objects and arrays as JSON, not nested tags), without
//     the string alternatives when it also allows strings (a raw string could read as a number).
// No string in the markup contains ']' (a value must never spell the namespace marker).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace m3::grammar {

struct ToolCallGrammarOptions {
  std::string namespace_marker;  // "]<]minimax[>["
  bool parallel = true;          // several invokes allowed
};

// `tools`: the request's OpenAI tools array; `only` (when not empty): the one function allowed.
// Errors name the tool's field ("tools[2].function.parameters.properties.x").
Grammar m3_tool_call_grammar(const nlohmann::ordered_json& tools, const std::string& only, const ToolCallGrammarOptions& options);

}  // namespace m3::grammar
