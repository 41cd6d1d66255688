// grammar_walk: the grammar engine driven by random tokens within its masks, for the oracle test
// (tests/grammar/test_grammar_oracle.py). Reads JSON lines {"kind", "spec", "seeds", "budget"} on
// stdin (kind: json_schema | json_object | regex | choice | grammar | tools), walks the
// vocabulary of the tokenizer in argv[1] from each seed, and prints one JSON line per spec:
// {"texts": [text or null per seed], "error": message, "keyword": keyword} (error when the spec
// did not compile). "tools" specs are {"tools": [...], "only": name, "parallel": bool, "markup":
// "minimax_m3" (default) or "minimax_m2"}.
#include <iostream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/grammar_error.h"
#include "grammar/structured_output.h"
#include "grammar/tool_call_grammar.h"
#include "text/tokenizer.h"

namespace {

using Json = nlohmann::ordered_json;
using m3::grammar::StructuredOutputSpec;

m3::grammar::Grammar grammar_of(const Json& line) {
  const std::string kind = line.at("kind");
  const Json& spec = line.at("spec");
  if (kind == "tools") {
    m3::grammar::ToolCallGrammarOptions o;
    o.markup = spec.value("markup", std::string("minimax_m3")) == "minimax_m2" ? m3::grammar::ToolCallMarkup::kMiniMaxM2
                                                                                 : m3::grammar::ToolCallMarkup::kMiniMaxM3;
    o.namespace_marker = "]<]minimax[>[";
    o.parallel = spec.value("parallel", true);
    return m3::grammar::tool_call_grammar(spec.at("tools"), spec.value("only", std::string()), o);
  }
  StructuredOutputSpec s;
  s.field = kind;
  if (kind == "json_schema") s.kind = StructuredOutputSpec::Kind::kJsonSchema, s.schema = spec;
  else if (kind == "json_object") s.kind = StructuredOutputSpec::Kind::kJsonObject;
  else if (kind == "regex") s.kind = StructuredOutputSpec::Kind::kRegex, s.text = spec.get<std::string>();
  else if (kind == "grammar") s.kind = StructuredOutputSpec::Kind::kGrammar, s.text = spec.get<std::string>();
  else if (kind == "choice") s.kind = StructuredOutputSpec::Kind::kChoice, s.choices = spec.get<std::vector<std::string>>();
  else throw std::runtime_error("unknown kind " + kind);
  return m3::grammar::structured_output_grammar(s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: grammar_walk MODEL_DIR < specs.jsonl\n";
    return 2;
  }
  const m3::text::Tokenizer tok = m3::text::Tokenizer::load(argv[1]);
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) bytes[static_cast<size_t>(id)] = tok.token_bytes(id);
  std::vector<int32_t> eos;
  if (tok.eos_token_id()) eos.push_back(*tok.eos_token_id());
  auto vocab = std::make_shared<const m3::grammar::Vocabulary>(bytes, eos);
  auto texts = std::make_shared<std::vector<std::string>>();
  std::string line_text;
  while (std::getline(std::cin, line_text)) {
    if (line_text.empty()) continue;
    const Json line = Json::parse(line_text);
    Json out = {{"texts", Json::array()}};
    try {
      auto g = std::make_shared<m3::grammar::CompiledGrammar>(grammar_of(line), vocab, line.at("kind").get<std::string>());
      const int budget = line.value("budget", 400);
      std::vector<uint32_t> words(static_cast<size_t>(m3::token_mask_words(vocab->size())));
      for (int seed = 0; seed < line.value("seeds", 4); ++seed) {
        m3::grammar::GrammarConstraint c(g, texts, "");
        std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 17);
        std::string text;
        bool done = false;
        for (int step = 0; step < budget && !done; ++step) {
          if (c.terminated()) {
            done = true;
            break;
          }
          c.fill_allowed(words, budget - step);
          std::vector<int32_t> allowed;
          for (int32_t i = 0; i < vocab->size(); ++i)
            if ((words[static_cast<size_t>(i) >> 5] >> (i & 31)) & 1u) allowed.push_back(i);
          const int32_t pick = allowed[rng() % allowed.size()];
          if (!c.accept(pick)) throw std::runtime_error("an allowed token was refused");
          if (vocab->bytes(pick)) text += *vocab->bytes(pick);
          else done = true;  // eos
        }
        if (!done && c.complete()) done = true;  // out of tokens, but the text is a whole match
        out["texts"].push_back(done ? Json(text) : Json(nullptr));
      }
    } catch (const m3::grammar::GrammarError& e) {
      out["error"] = e.what();
      out["keyword"] = e.keyword();
    }
    std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n" << std::flush;
  }
  return 0;
}
