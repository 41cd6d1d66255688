// A grammar lowered to bytes: one Thompson NFA per rule whose edges read a byte range, move
// without input, or call another rule (push the return state, run the callee to its accept
// state, pop). Regular grammars need no calls; recursive ones (nested JSON, EBNF) run as a
// pushdown automaton (grammar/automaton.h). Compilation checks what would make matching
// unbounded: left recursion (a rule reaching itself without reading a byte) and sizes.
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace m3::grammar {

inline constexpr int32_t kMaxNfaStates = 400000;  // about 40 MB; a larger spec is refused

struct ByteEdge {
  uint8_t lo = 0, hi = 0;
  int32_t to = -1;
};

struct NfaState {
  int32_t rule = -1;
  std::vector<ByteEdge> bytes;
  std::vector<int32_t> eps;
  int32_t call = -1;  // rule called from here, returning to `ret`
  int32_t ret = -1;
};

struct Nfa {
  std::vector<NfaState> states;
  std::vector<int32_t> rule_start, rule_accept;
  std::vector<std::string> rule_names;
  int32_t start_rule = -1;
  // Fewest bytes from a state to its rule's accept state (calls count their callee's shortest
  // text); kUnreachable when the accept state cannot be reached.
  std::vector<int32_t> min_to_accept;
  static constexpr int32_t kUnreachable = INT32_MAX / 4;
};

// `what` names the spec in errors ("json_schema", "regex", "grammar", ...).
Nfa compile_nfa(const Grammar& g, const std::string& what);

}  // namespace m3::grammar
