#include "grammar/byte_chains.h"

namespace m3::grammar {

ByteChains::Chain ByteChains::compute(int32_t state, uint8_t lead_byte) {
  Chain c;
  const int32_t to_accept = automaton_.bytes_to_accept(state);
  TokenTrie::ByteSet along;
  along.fill(~uint64_t(0));
  int32_t at = state;
  for (int32_t j = 0; j < kMaxLength; ++j) {
    const int32_t to = automaton_.next(at, lead_byte);
    if (to == Automaton::kDead || automaton_.bytes_to_accept(to) != to_accept) break;
    TokenTrie::ByteSet same{};
    for (int b = 0; b < 256; ++b)
      if (automaton_.next(at, static_cast<uint8_t>(b)) == to) same[b >> 6] |= uint64_t(1) << (b & 63);
    for (int k = 0; k < 4; ++k) along[k] &= same[k];
    c.bytes[static_cast<size_t>(j)] = along;
    c.states[static_cast<size_t>(j)] = to;
    c.length = j + 1;
    if (to == at) {
      // A loop: every further step is this one again.
      for (int32_t k = j + 1; k < kMaxLength; ++k) c.bytes[static_cast<size_t>(k)] = along, c.states[static_cast<size_t>(k)] = to;
      c.length = kMaxLength;
      c.endless = true;
      break;
    }
    at = to;
  }
  return c;
}

const ByteChains::Chain& ByteChains::chain(int32_t state, size_t lead) {
  auto& by_state = chains_[lead];
  const auto i = static_cast<size_t>(state);
  if (by_state.size() <= i) by_state.resize(i + 1);
  if (!by_state[i]) by_state[i] = std::make_unique<Chain>(compute(state, kLeadBytes[lead]));
  return *by_state[i];
}

}  // namespace m3::grammar
