// The byte automaton of a compiled grammar, determinized lazily: a state is the set of pushdown
// configurations (a stack of NFA states: return states, then the current one) that the bytes so
// far can lead to, after following every move that reads nothing. States and their transitions
// are built on first use and kept; for a regular grammar this is the grammar's DFA, for a
// recursive one the states actually visited. Configurations that can no longer reach the end
// are dropped, so a state that exists can always be completed.
//
// Not thread-safe: one user at a time (grammar/compiled_grammar.h holds the lock).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "grammar/nfa.h"

namespace m3::grammar {

inline constexpr int32_t kMaxAutomatonStates = 200000;  // beyond: GrammarError (the request fails)
inline constexpr int32_t kMaxConfigsPerState = 4096;    // an ambiguity bound
inline constexpr int32_t kMaxStackDepth = 256;          // deeper nesting is not generated

class Automaton {
 public:
  static constexpr int32_t kDead = -1;

  explicit Automaton(std::shared_ptr<const Nfa> nfa);

  int32_t start() const { return start_; }
  // The state after `byte`, or kDead. Builds it on first use (may throw GrammarError at a limit).
  int32_t next(int32_t state, uint8_t byte) {
    const int32_t slot = states_[static_cast<size_t>(state)].next[byte];
    return slot != kUnknown ? slot : fill_next(state, byte);
  }
  // The text so far is a complete match.
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accepting; }
  // Some byte can follow.
  bool can_continue(int32_t state) const { return states_[static_cast<size_t>(state)].can_continue; }
  // Fewest bytes that complete the match from here (0 when accepting).
  int32_t bytes_to_accept(int32_t state) const { return states_[static_cast<size_t>(state)].to_accept; }
  // The deepest stack of the state's configurations (1: no rule call pending).
  int32_t stack_depth(int32_t state) const { return states_[static_cast<size_t>(state)].stack_depth; }
  size_t num_states() const { return states_.size(); }
  const Nfa& nfa() const { return *nfa_; }

 private:
  static constexpr int32_t kUnknown = -2;
  struct State {
    std::vector<int32_t> key;  // flattened sorted configurations: length, stack..., length, ...
    bool accepting = false;
    bool can_continue = false;
    int32_t to_accept = 0;
    int32_t stack_depth = 0;
    std::unique_ptr<int32_t[]> next;  // [256]
  };
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };

  // Adds the closure of `config` to `out`; sets *accepting when a bottom-level accept is reached.
  void close(std::vector<int32_t> config, std::vector<std::vector<int32_t>>& out, bool* accepting) const;
  // The closure of the configuration {nfa_state} (no call pending: most configurations of most
  // grammars), computed once.
  struct Closure {
    std::vector<std::vector<int32_t>> configs;
    bool accepting = false;
  };
  const Closure& bottom_closure(int32_t nfa_state);
  int32_t intern(std::vector<std::vector<int32_t>> configs, bool accepting);
  int32_t compute_next(int32_t state, uint8_t byte);
  // Computes next(state, byte) and sets it for every byte of the same class.
  int32_t fill_next(int32_t state, uint8_t byte);
  bool live(const std::vector<int32_t>& config) const;

  std::shared_ptr<const Nfa> nfa_;
  std::vector<State> states_;
  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> index_;
  std::vector<std::unique_ptr<Closure>> bottom_closures_;  // by NFA state
  int32_t start_ = kDead;
  // Bytes no NFA edge tells apart (the edges' ranges cut 0-255 into classes) lead from every
  // state to the same state: one transition is computed per class.
  std::array<uint8_t, 256> byte_class_{};
  std::vector<std::vector<uint8_t>> class_bytes_;  // by class
};

}  // namespace m3::grammar
