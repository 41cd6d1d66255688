// Structured outputs on the server's side: a request's spec (or its tools, for a required or
// named tool_choice) -> grammar -> CompiledGrammar over the served model's vocabulary ->
// the TokenConstraintSpec the engine runs. One per served model (ModelContext::constraints).
//
//  - The vocabulary is built once, on first use, from the tokenizer's token bytes, in two
//    versions: special tokens as their text (when the client's text keeps them: the reasoning
//    and tool parsers read it that way) or never allowed (skip_special_tokens drops them, so a
//    grammar must not count on them).
//  - Compiled grammars are cached by their spec (kMaxCachedGrammars, least recently used out), so
//    a schema used again starts with its masks already computed.
//  - A new spec's request waits for the masks computed ahead (at most kFirstUseWait, outside the
//    compiler's lock), so that its first tokens do not meet masks still to compute: a large
//    schema pays up to about a second once, in its first request's time to first token, instead
//    of milliseconds per token in its first sequence (docs/structured-outputs.md, "Cost").
//  - A spec the grammar engine cannot enforce is a 400 naming the keyword or field.
#pragma once
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/structured_output.h"
#include "ops/token_constraint.h"
#include "text/tokenizer.h"

namespace m3::server {

inline constexpr size_t kMaxCachedGrammars = 64;
inline constexpr std::chrono::milliseconds kFirstUseWait{2000};

class ConstraintCompiler {
 public:
  struct Target {
    const text::Tokenizer* tokenizer = nullptr;
    int vocab_size = 0;                 // the engine's (ids past the tokenizer's are never allowed)
    std::vector<int32_t> eos_token_ids;  // allowed where the text is complete
    bool special_tokens_visible = false;
    std::string start_after;             // the constraint starts after this text (end of reasoning)
  };

  // response_format / structured_outputs / guided_*.
  std::shared_ptr<const TokenConstraintSpec> for_spec(const grammar::StructuredOutputSpec& spec, const Target& target);
  // tool_choice "required" (only empty) or a named function, in the markup of `parser`
  // ("minimax_m3" or "minimax_m2", the --tool-call-parser names).
  std::shared_ptr<const TokenConstraintSpec> for_tool_calls(std::string_view parser, const nlohmann::ordered_json& tools,
                                                            const std::string& only, bool parallel, const Target& target);

 private:
  struct Vocab {
    std::shared_ptr<const grammar::Vocabulary> vocabulary;
    std::shared_ptr<const std::vector<std::string>> texts;  // every token's text (special included)
  };
  const Vocab& vocab(const Target& target);
  std::shared_ptr<grammar::CompiledGrammar> compiled(const std::string& key, const std::function<grammar::Grammar()>& build,
                                                     const Target& target, const std::string& field);

  std::mutex mu_;
  std::unique_ptr<Vocab> vocabs_[2];  // [special tokens visible]
  std::list<std::pair<std::string, std::shared_ptr<grammar::CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> cache_;
};

}  // namespace m3::server
