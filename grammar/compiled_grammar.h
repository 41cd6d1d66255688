// A grammar compiled against a vocabulary: its byte automaton (grammar/automaton.h) and the token
// masks of the states visited so far. Shared by every sequence that uses the same constraint
// (the n samples of a request, and requests with the same spec when the server caches it); one
// mutex guards the lazily built automaton and the mask cache.
//
// A state's mask: each token whose bytes, read from that state, keep the automaton alive (the
// vocabulary trie is walked from the state, a subtree dropped as soon as its prefix is dead), plus
// the eos ids where the text is complete. Byte-level tokens that straddle the end of one grammar
// element and the start of the next are therefore judged exactly. Masks of regular parts repeat
// and come from the cache; the cache is bounded (kMaskCacheBytes) and dropped whole when full.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/vocabulary.h"

namespace m3::grammar {

inline constexpr size_t kMaskCacheBytes = size_t(256) << 20;
inline constexpr std::chrono::milliseconds kMaxMaskTime{2000};  // one mask, else the request fails

class CompiledGrammar {
 public:
  // Throws GrammarError when the grammar cannot be compiled (naming `what`).
  CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what);

  const Vocabulary& vocabulary() const { return *vocab_; }
  int32_t start_state() const { return start_; }
  // The state after the bytes, or Automaton::kDead.
  int32_t advance(int32_t state, std::string_view bytes);
  bool accepting(int32_t state);
  bool can_continue(int32_t state);
  // Fewest bytes that complete the text from `state`.
  int32_t bytes_to_accept(int32_t state);
  // The allowed next tokens from `state` into `words` (token_mask_words(vocab) of them). When
  // `remaining_tokens` could not complete the text after some allowed token, only tokens after
  // which the shortest completion still fits are kept (each further token adds at least a byte).
  // Returns the number of allowed tokens.
  int64_t fill_mask(int32_t state, std::span<uint32_t> words, int remaining_tokens);

 private:
  struct Mask {
    std::vector<uint32_t> words;
    int64_t count = 0;
    int32_t worst_to_accept = 0;  // the largest bytes_to_accept after an allowed token
    // Allowed tokens after which the text is further from complete than from this state plus
    // kDeepMargin bytes (those that open structures), with that distance: a budget of at least
    // bytes_to_accept(state) + kDeepMargin needs only these taken out, not a new walk.
    std::vector<std::pair<int32_t, int32_t>> deep;
  };
  static constexpr int32_t kDeepMargin = 8;
  static constexpr size_t kMaxDeepTokens = 4096;  // beyond: the budgeted mask is walked afresh
  // Walks the trie from `state`; with budget >= 0 keeps only tokens ending within it.
  Mask walk(int32_t state, int32_t budget);

  std::shared_ptr<const Vocabulary> vocab_;
  std::mutex mu_;
  Automaton automaton_;
  int32_t start_;
  // The bytes that lead from a state back to itself (string bodies, repeats): a trie subtree
  // whose bytes all loop is allowed whole, without a walk through it.
  const Vocabulary::ByteSet& loop_bytes(int32_t state);
  std::unordered_map<int32_t, Vocabulary::ByteSet> loops_;
  std::unordered_map<int32_t, Mask> masks_;
  size_t mask_bytes_ = 0;
};

}  // namespace m3::grammar
