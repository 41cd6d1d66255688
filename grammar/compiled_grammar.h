// A grammar compiled against a vocabulary: its byte automaton (grammar/automaton.h) and the token
// masks of its states. Shared by every sequence that uses the same constraint (the n samples of
// a request, and requests with the same spec when the server caches it); one mutex guards the
// lazily built automaton and the mask cache.
//
// A state's mask: each token whose bytes, read from that state, keep the automaton alive, plus
// the eos ids where the text is complete. Byte-level tokens that straddle the end of one grammar
// element and the start of the next are therefore judged exactly. Two ways to the same set:
//  - a state uniform over a text class (grammar/text_runs.h: string bodies, counted or not,
//    free text, letters and digits, numbers, structural states where no plain text fits) takes
//    the class's tokens of the lengths that fit as one precomputed bitset and walks only the
//    trie of the other tokens;
//  - any other state walks the trie of every token, a subtree dropped as soon as its prefix is
//    dead and taken whole when all its bytes follow one byte chain (grammar/byte_chains.h).
// Masks are cached per state; the cache is bounded (kMaskCacheBytes) and dropped whole when full.
// The masks of the states the tokens can reach are computed ahead, breadth first from the start:
// at construction for a short time, then on the grammar's own thread, one mask at a time under
// the lock and giving way to sequences that wait for it, so a new spec's first sequence finds
// most of its masks cached and the following ones find all.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/byte_chains.h"
#include "grammar/grammar.h"
#include "grammar/text_runs.h"
#include "grammar/vocabulary.h"

namespace m3::grammar {

inline constexpr size_t kMaskCacheBytes = size_t(256) << 20;
inline constexpr std::chrono::milliseconds kMaxMaskTime{2000};  // one mask, else the request fails
// One mask computed ahead, else the work ahead stops: it must not hold a compile or the lock for
// long (a sequence that needs that mask computes it under kMaxMaskTime).
inline constexpr std::chrono::milliseconds kMaxMaskTimeAhead{100};
// Masks computed ahead only for states whose stack (nesting below the start) is this shallow,
// since a recursive grammar has no end of states.
inline constexpr int32_t kPrecomputeStackDepth = 4;
// ... and only while the grammar's cached masks take less than this.
inline constexpr size_t kPrecomputeBytes = size_t(32) << 20;

struct PrecomputeLimits {
  std::chrono::milliseconds at_construction{50};
  std::chrono::milliseconds in_background{10000};
};
inline constexpr PrecomputeLimits kNoPrecompute{std::chrono::milliseconds(0), std::chrono::milliseconds(0)};

class CompiledGrammar {
 public:
  // Throws GrammarError when the grammar cannot be compiled (naming `what`).
  CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what,
                  PrecomputeLimits precompute = {});
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

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
  // How many states' masks are cached, and their bytes (equal bitsets counted once).
  size_t cached_masks();
  size_t cached_mask_bytes();
  // Blocks until the masks computed ahead are done (benchmarks, tests).
  void wait_precomputed();
  // Blocks until the masks computed ahead are done or `timeout` has passed; true when done. The
  // server waits so for a new spec before its first sequence, whose tokens then cost what a
  // warm spec's do (the wait is that request's time to first token, not a step's).
  bool wait_precomputed_for(std::chrono::milliseconds timeout);

 private:
  struct Mask {
    std::vector<uint32_t> words;  // while it is built
    std::shared_ptr<const std::vector<uint32_t>> cached_words;  // once cached: equal masks share it
    int64_t count = 0;
    int32_t worst_to_accept = 0;  // the largest bytes_to_accept after an allowed token
    // The allowed tokens after which the text is further from complete than from this state
    // (they open structures), and those after which it is nearer (they close them), each with
    // that distance; "listed" false when they were too many to list. With both lists, a mask
    // for any budget of tokens left is the cached one with some tokens taken out, or only the
    // nearer ones, not a new walk.
    std::vector<std::pair<int32_t, int32_t>> further, nearer;
    bool further_listed = true, nearer_listed = true;
    // The states the allowed tokens lead to (some more, never fewer): where the masks computed
    // ahead go next.
    std::vector<int32_t> ends;
  };
  static constexpr size_t kMaxListedTokens = 2048;

  // The mask of `state`; with budget >= 0 only tokens after which the text completes within it
  // (and no ends).
  // Throws GrammarError past `limit`.
  Mask compute_mask(int32_t state, int32_t budget, std::chrono::milliseconds limit = kMaxMaskTime);
  // Adds the tokens of `trie` allowed from `state` to `m`.
  void walk(const TokenTrie& trie, int32_t state, int32_t budget, Mask& m, std::chrono::milliseconds limit);
  // Adds `state` to m.ends once per mask (end_marks_ by state, the mask's number in mask_number_).
  void add_end(Mask& m, int32_t state);
  const Mask& cache(int32_t state, Mask m);
  // The states whose masks are to be computed ahead: breadth first from the start (`queue`,
  // `seen` by state), and before those the states the sequences can reach with their next
  // token (`next_of_sequences`, newest last), while the work ahead runs (`running`).
  struct Ahead {
    std::deque<int32_t> queue;
    std::vector<char> seen;
    std::vector<int32_t> next_of_sequences;
    bool running = false;
  };
  static constexpr size_t kMaxNextOfSequences = 4096;
  // Computes the next mask ahead (the lock held); false when there is none left or a size limit
  // is near.
  bool precompute_one();
  void precompute_in_background(std::chrono::milliseconds limit, std::stop_token stop);
  // While the work ahead runs: the states `m` leads to go first.
  void ask_ahead(const Mask& m);
  // The lock, taken by a sequence: the background work gives way while one waits.
  std::unique_lock<std::mutex> lock_for_sequence();
  // When all of the subtree below `child` (reached in `state`) is allowed along a byte chain
  // (grammar/byte_chains.h): the chain, else nullptr.
  const ByteChains::Chain* whole_subtree(const TokenTrie& trie, int32_t child, int32_t state);
  static constexpr int32_t kMinChainTokens = 32;  // smaller subtrees are walked

  std::shared_ptr<const Vocabulary> vocab_;
  std::mutex mu_;
  Automaton automaton_;
  int32_t start_;
  std::array<TextRuns, kNumTextClasses> runs_{TextRuns(automaton_, TextClass::kPlain),
                                               TextRuns(automaton_, TextClass::kAlnum),
                                               TextRuns(automaton_, TextClass::kDigits)};
  ByteChains chains_{automaton_};
  std::unordered_map<int32_t, Mask> masks_;
  // The distinct cached bitsets by a hash of their words (string positions far from their limit
  // share one), and their bytes with the lists'.
  std::unordered_map<uint64_t, std::shared_ptr<const std::vector<uint32_t>>> distinct_words_;
  size_t mask_bytes_ = 0;
  Ahead ahead_;
  std::vector<uint32_t> end_marks_;
  uint32_t mask_number_ = 0;
  std::atomic<int> sequences_waiting_{0};
  std::condition_variable ahead_done_;  // with mu_: ahead_.running went false
  std::mutex thread_mu_;  // guards the join of precompute_thread_
  std::jthread precompute_thread_;  // last: stopped and joined before the rest goes
};

}  // namespace m3::grammar
