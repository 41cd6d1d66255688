#include "grammar/structured_output.h"

#include <fmt/format.h>

#include "grammar/ebnf.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace m3::grammar {

Grammar structured_output_grammar(const StructuredOutputSpec& spec) {
  using Kind = StructuredOutputSpec::Kind;
  switch (spec.kind) {
    case Kind::kJsonSchema: {
      JsonSchemaOptions o;
      o.what = spec.field;
      return json_schema_grammar(spec.schema, o);
    }
    case Kind::kJsonObject: return json_object_grammar();
    case Kind::kGrammar: {
      try {
        return parse_ebnf(spec.text);
      } catch (const GrammarError& e) {
        throw GrammarError(spec.field, fmt::format("{}: {}", spec.field, e.what()));
      }
    }
    case Kind::kRegex: {
      Grammar g;
      const int32_t root = g.add_rule("root");
      RegexOptions o;
      o.what = spec.field;
      g.set_body(root, parse_regex(g, spec.text, o));
      g.set_start(root);
      return g;
    }
    case Kind::kChoice: {
      if (spec.choices.empty()) throw GrammarError(spec.field, fmt::format("{}: must be a non-empty list", spec.field));
      Grammar g;
      const int32_t root = g.add_rule("root");
      std::vector<int32_t> options;
      for (const std::string& c : spec.choices) {
        if (c.empty()) throw GrammarError(spec.field, fmt::format("{}: choices must not be empty strings", spec.field));
        decode_utf8(c, spec.field);
        options.push_back(g.byte_string(c));
      }
      g.set_body(root, g.alt(std::move(options)));
      g.set_start(root);
      return g;
    }
  }
  throw GrammarError(spec.field, "unknown structured output kind");
}

}  // namespace m3::grammar
