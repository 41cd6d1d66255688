// The grammar of a tool-call block in a MiniMax model's markup (text/tool_parser.h is its reader;
// the chat templates write the same layout). NS is M3's namespace marker:
//   minimax_m3                                          minimax_m2
//   NS"<tool_call>\n" invoke+ NS"</tool_call>"           "<minimax:tool_call>\n" invoke+ "</minimax:tool_call>"
//   invoke = NS"<invoke name=\"" NAME "\">"             "<invoke name=\"" NAME "\">\n"
//            param* NS"</invoke>\n"                      param* "</invoke>\n"
//   param  = NS"<" KEY ">" VALUE NS"</" KEY ">"          "<parameter name=\"" KEY "\">" VALUE "</parameter>\n"
// (exactly one invoke when `parallel` is false; the function's properties in schema order, every
// required one present). VALUE is written so that the parser's schema coercion
// (text/json_schema_coerce.h) gives back a value that validates against the property's schema:
//   - a property that allows only strings (or strings and null): the string itself, raw;
//   - any other property: its JSON text (objects and arrays as JSON, not nested tags), without
//     the string alternatives when it also allows strings (a raw string could read as a number).
// No string holds markup: none contains ']' in M3 (a value must never spell the namespace
// marker), none contains '<' in M2 (its tags are plain text); JSON strings may spell them as
// \u escapes.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace m3::grammar {

enum class ToolCallMarkup { kMiniMaxM3, kMiniMaxM2 };

struct ToolCallGrammarOptions {
  ToolCallMarkup markup = ToolCallMarkup::kMiniMaxM3;
  std::string namespace_marker;  // M3's "]<]minimax[>["
  bool parallel = true;          // several invokes allowed
};

// `tools`: the request's OpenAI tools array; `only` (when not empty): the one function allowed.
// Errors name the tool's field ("tools[2].function.parameters.properties.x").
Grammar tool_call_grammar(const nlohmann::ordered_json& tools, const std::string& only, const ToolCallGrammarOptions& options);

}  // namespace m3::grammar
