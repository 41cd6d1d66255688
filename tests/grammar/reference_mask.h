// The simplest correct token mask, for tests: every token's bytes read from the state one by
// one, with the same rule for the tokens left as CompiledGrammar::fill_mask (keep the tokens
// after which the shortest completion fits in the tokens left, one byte a token; when none
// does, keep them all).
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace m3::grammar::testing {

inline std::vector<uint32_t> reference_mask(CompiledGrammar& g, int32_t state, int remaining_tokens) {
  const Vocabulary& v = g.vocabulary();
  const size_t words = static_cast<size_t>((v.size() + 31) / 32);
  std::vector<uint32_t> all(words, 0u), within(words, 0u);
  bool any_within = false;
  const int32_t budget = remaining_tokens - 1;
  for (int32_t id = 0; id < v.size(); ++id) {
    bool allowed = false;
    int32_t to_accept = 0;
    if (std::find(v.eos_ids().begin(), v.eos_ids().end(), id) != v.eos_ids().end()) {
      allowed = g.accepting(state);
    } else if (v.bytes(id) && !v.bytes(id)->empty()) {
      const int32_t end = g.advance(state, *v.bytes(id));
      allowed = end != Automaton::kDead;
      if (allowed) to_accept = g.bytes_to_accept(end);
    }
    if (!allowed) continue;
    all[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    if (to_accept <= budget) {
      within[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
      any_within = true;
    }
  }
  return remaining_tokens <= 0 || !any_within ? all : within;
}

}  // namespace m3::grammar::testing
