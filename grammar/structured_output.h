// What a client asks the output to be (vLLM's structured outputs: json, regex, choice, grammar,
// json_object; OpenAI's response_format), as one value, and its grammar.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace m3::grammar {

struct StructuredOutputSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  nlohmann::ordered_json schema;             // kJsonSchema
  std::string text;                  // kRegex: the pattern; kGrammar: the EBNF
  std::vector<std::string> choices;  // kChoice: the output is exactly one of them
  std::string field;                 // the request field it came from, for errors
};

// Throws GrammarError naming the keyword (json schema) or the field.
Grammar structured_output_grammar(const StructuredOutputSpec& spec);

}  // namespace m3::grammar
