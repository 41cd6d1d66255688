// TokenConstraint (ops/token_constraint.h) over a compiled grammar: the sequence's state in the
// automaton, one entry per accepted token (so rollback is exact), and an optional start marker:
// with reasoning on, the constraint starts once the output text contains the marker (the end of
// reasoning) and constrains only what follows it; before that only eos is excluded, so the
// sequence cannot end before it reaches the constrained part, and once the tokens left are
// only just enough for the constrained text (one byte a token), the marker is forced when one
// token spells it (the reasoning is cut short so that the structured part completes).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "ops/token_constraint.h"

namespace m3::grammar {

class GrammarConstraintSpec final : public TokenConstraintSpec {
 public:
  // `token_texts[i]`: the text token i adds to the output, special tokens included (to find the
  // start marker); `start_after` empty: constrained from the first token.
  GrammarConstraintSpec(std::shared_ptr<CompiledGrammar> grammar,
                        std::shared_ptr<const std::vector<std::string>> token_texts, std::string start_after);
  std::unique_ptr<TokenConstraint> start() const override;

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  std::shared_ptr<const std::vector<std::string>> token_texts_;
  std::string start_after_;
  int32_t marker_token_;  // found once here, not per sequence
};

// The token whose text is exactly `marker`, or -1.
int32_t marker_token(const std::vector<std::string>& token_texts, const std::string& marker);

class GrammarConstraint final : public TokenConstraint {
 public:
  // `marker_token`: marker_token(*token_texts, start_after), or -2 to have it looked up here.
  GrammarConstraint(std::shared_ptr<CompiledGrammar> grammar,
                    std::shared_ptr<const std::vector<std::string>> token_texts, std::string start_after,
                    int32_t marker_token = -2);
  bool fill_allowed(std::span<uint32_t> words, int remaining_tokens) override;
  bool accept(int32_t token) override;
  bool terminated() const override;
  void rollback(int num_tokens) override;

  bool active() const { return history_.back().active; }
  // The text so far is a complete match (more may still follow).
  bool complete() const;
  int32_t state() const { return history_.back().state; }

 private:
  struct Entry {
    bool active = false;
    int32_t state = 0;       // automaton state (active)
    bool ended = false;      // an eos was accepted in an accepting state
    size_t text_length = 0;  // output text kept while looking for the start marker (inactive)
  };
  std::shared_ptr<CompiledGrammar> grammar_;
  std::shared_ptr<const std::vector<std::string>> token_texts_;
  std::string start_after_;
  int32_t marker_token_ = -1;  // a token whose text is the whole start marker, if there is one
  std::string text_;  // output text before activation (searched for the marker)
  std::vector<Entry> history_;
};

}  // namespace m3::grammar
