// From an automaton state, how far the bytes that move it exactly as one common byte does ('e',
// or '0' for numbers) keep doing so, step after step, without the text getting nearer to or
// further from complete: a looping state (a string body, a repeat) goes on without end, a
// counted one (a pattern's {1,20}) for the count left. A trie subtree whose bytes all lie in the
// chain's bytes for its height is allowed whole, every token ending on the chain, without a walk
// through it; this is what keeps the states outside the text classes (grammar/text_runs.h)
// cheap. Computed on demand and kept per state. Not thread-safe: used under the lock of
// grammar/compiled_grammar.h.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/token_trie.h"

namespace m3::grammar {

class ByteChains {
 public:
  static constexpr int32_t kMaxLength = 32;
  static constexpr std::array<uint8_t, 2> kLeadBytes = {'e', '0'};

  explicit ByteChains(Automaton& automaton) : automaton_(automaton) {}

  struct Chain {
    int32_t length = 0;    // steps that stay alive with bytes_to_accept unchanged (<= kMaxLength)
    bool endless = false;  // the chain reaches a loop: any number of steps
    // [h - 1]: the bytes that move each of the first h steps as the lead byte does.
    std::array<TokenTrie::ByteSet, kMaxLength> bytes{};
    std::array<int32_t, kMaxLength> states{};  // [j - 1]: the state after j steps
  };
  // The chain of `state` led by kLeadBytes[lead].
  const Chain& chain(int32_t state, size_t lead);

 private:
  Chain compute(int32_t state, uint8_t lead_byte);

  Automaton& automaton_;
  std::array<std::vector<std::unique_ptr<Chain>>, kLeadBytes.size()> chains_;  // by lead, by state
};

}  // namespace m3::grammar
