// A grammar compiled against a vocabulary: its byte automaton (grammar/automaton.h) and the token
// masks of its states. Shared by every sequence that uses the same constraint (the n samples of
// a request, and requests with the same spec when the server caches it); one mutex guards the
// lazily built automaton and the mask cache.
//
// A state's mask: each token whose bytes, read from that state, keep the automaton alive, plus
// the eos ids where the text is complete. Byte-level tokens that straddle the end of one grammar
// element and the start of the next are therefore judged exactly. Two ways to the same set:
//  - a state uniform over a text class (grammar/text_runs.h: string bodies, counted or not, free
//    text, letters and digits, numbers, structural states where no plain text fits) takes the class's tokens of the
//    lengths that fit as one precomputed bitset and walks only the trie of the other tokens;
//  - any other state walks the trie of every token, a subtree dropped as soon as its prefix is
//    dead and taken whole when all its bytes loop on the state.
// Masks are cached per state; the cache is bounded (kMaskCacheBytes) and dropped whole when full.
// At construction the masks of the states the first tokens can reach are computed ahead (breadth
// first from the start, within a time limit), so a new spec's first sequence finds them cached.
#pragma once
#include <array>
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
#include "grammar/text_runs.h"
#include "grammar/vocabulary.h"

namespace m3::grammar {

inline constexpr size_t kMaskCacheBytes = size_t(256) << 20;
inline constexpr std::chrono::milliseconds kMaxMaskTime{2000};  // one mask, else the request fails
// Masks computed at construction: at most this long, and only for states whose stack (nesting
// below the start) is this shallow, since a recursive grammar has no end of states.
inline constexpr std::chrono::milliseconds kPrecomputeTime{150};
inline constexpr int32_t kPrecomputeStackDepth = 4;

class CompiledGrammar {
 public:
  // Throws GrammarError when the grammar cannot be compiled (naming `what`). `precompute_time`:
  // how long construction may spend computing masks ahead (zero: none, all lazily).
  CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what,
                  std::chrono::milliseconds precompute_time = kPrecomputeTime);

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
  // How many states' masks are cached (the precomputed ones, right after construction).
  size_t cached_masks();

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

  // The mask of `state`; with budget >= 0 only tokens after which the text completes within it.
  // `ends`, when given, receives the states the allowed tokens lead to (some more, never fewer).
  Mask compute_mask(int32_t state, int32_t budget, std::vector<int32_t>* ends);
  // Adds the tokens of `trie` allowed from `state` to `m`.
  void walk(const TokenTrie& trie, int32_t state, int32_t budget, Mask& m, std::vector<int32_t>* ends);
  const Mask& cache(int32_t state, Mask m);
  void precompute(std::chrono::milliseconds limit);
  // The bytes that lead from a state back to itself (string bodies, repeats): a trie subtree
  // whose bytes all loop is allowed whole, without a walk through it.
  const TokenTrie::ByteSet& loop_bytes(int32_t state);

  std::shared_ptr<const Vocabulary> vocab_;
  std::mutex mu_;
  Automaton automaton_;
  int32_t start_;
  std::array<TextRuns, kNumTextClasses> runs_{TextRuns(automaton_, TextClass::kPlain),
                                               TextRuns(automaton_, TextClass::kAlnum),
                                               TextRuns(automaton_, TextClass::kDigits)};
  std::vector<std::unique_ptr<TokenTrie::ByteSet>> loops_;  // by state
  std::unordered_map<int32_t, Mask> masks_;
  size_t mask_bytes_ = 0;
};

}  // namespace m3::grammar
