#include "grammar/grammar_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace m3::grammar {

GrammarConstraintSpec::GrammarConstraintSpec(std::shared_ptr<CompiledGrammar> grammar,
                                             std::shared_ptr<const std::vector<std::string>> token_texts,
                                             std::string start_after)
    : grammar_(std::move(grammar)),
      token_texts_(std::move(token_texts)),
      start_after_(std::move(start_after)),
      marker_token_(marker_token(*token_texts_, start_after_)) {}

std::unique_ptr<TokenConstraint> GrammarConstraintSpec::start() const {
  return std::make_unique<GrammarConstraint>(grammar_, token_texts_, start_after_, marker_token_);
}

int32_t marker_token(const std::vector<std::string>& token_texts, const std::string& marker) {
  if (marker.empty()) return -1;
  for (size_t id = 0; id < token_texts.size(); ++id)
    if (token_texts[id] == marker) return static_cast<int32_t>(id);
  return -1;
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<CompiledGrammar> grammar,
                                     std::shared_ptr<const std::vector<std::string>> token_texts,
                                     std::string start_after, int32_t marker)
    : grammar_(std::move(grammar)),
      token_texts_(std::move(token_texts)),
      start_after_(std::move(start_after)),
      marker_token_(marker == -2 ? marker_token(*token_texts_, start_after_) : marker) {
  Entry first;
  first.active = start_after_.empty();
  first.state = grammar_->start_state();
  history_.push_back(first);
}

bool GrammarConstraint::fill_allowed(std::span<uint32_t> words, int remaining_tokens) {
  const Entry& cur = history_.back();
  if (!cur.active) {
    // Before the start marker (still reasoning) anything goes but the end of the sequence: the
    // output must reach the constrained part (or run out of tokens).
    if (marker_token_ >= 0 && remaining_tokens > 0 &&
        remaining_tokens <= grammar_->bytes_to_accept(grammar_->start_state()) + 2) {
      std::fill(words.begin(), words.end(), 0u);
      words[static_cast<size_t>(marker_token_) >> 5] |= 1u << (marker_token_ & 31);
      return true;
    }
    const auto& eos = grammar_->vocabulary().eos_ids();
    if (eos.empty()) return false;
    std::fill(words.begin(), words.end(), ~0u);
    for (int32_t id : eos)
      if (id >= 0 && static_cast<size_t>(id >> 5) < words.size()) words[static_cast<size_t>(id) >> 5] &= ~(1u << (id & 31));
    return true;
  }
  const int64_t allowed = grammar_->fill_mask(cur.state, words, remaining_tokens);
  // An empty mask would leave the sampler nothing to pick; say so instead of sampling freely.
  M3_CHECK(allowed > 0, "structured output: no token of the vocabulary can continue the constrained text");
  return true;
}

bool GrammarConstraint::accept(int32_t token) {
  Entry next = history_.back();
  if (next.ended) return false;
  const Vocabulary& v = grammar_->vocabulary();
  if (!next.active) {
    if (token >= 0 && static_cast<size_t>(token) < token_texts_->size()) text_ += (*token_texts_)[static_cast<size_t>(token)];
    next.text_length = text_.size();
    const size_t at = text_.find(start_after_);
    if (at == std::string::npos) {
      history_.push_back(next);
      return true;
    }
    // The marker closed inside this token: what follows it in the token is constrained already.
    next.active = true;
    next.state = grammar_->advance(grammar_->start_state(), std::string_view(text_).substr(at + start_after_.size()));
    if (next.state == Automaton::kDead) return false;
    history_.push_back(next);
    return true;
  }
  if (token < 0 || token >= v.size()) return false;
  if (std::find(v.eos_ids().begin(), v.eos_ids().end(), token) != v.eos_ids().end()) {
    if (!grammar_->accepting(next.state)) return false;
    next.ended = true;
    history_.push_back(next);
    return true;
  }
  const auto& bytes = v.bytes(token);
  if (!bytes) return false;
  const int32_t state = grammar_->advance(next.state, *bytes);
  if (state == Automaton::kDead) return false;
  next.state = state;
  history_.push_back(next);
  return true;
}

bool GrammarConstraint::terminated() const {
  const Entry& cur = history_.back();
  if (!cur.active) return false;
  return cur.ended || (grammar_->accepting(cur.state) && !grammar_->can_continue(cur.state));
}

bool GrammarConstraint::complete() const {
  const Entry& cur = history_.back();
  return cur.active && (cur.ended || grammar_->accepting(cur.state));
}

void GrammarConstraint::rollback(int num_tokens) {
  M3_CHECK(num_tokens >= 0 && static_cast<size_t>(num_tokens) < history_.size(),
           "constraint rollback of {} tokens, but only {} were accepted", num_tokens, history_.size() - 1);
  history_.resize(history_.size() - static_cast<size_t>(num_tokens));
  if (!history_.back().active) text_.resize(history_.back().text_length);
}

}  // namespace m3::grammar
