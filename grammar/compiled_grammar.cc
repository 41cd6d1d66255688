#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {
namespace {

std::shared_ptr<const Nfa> build_nfa(const Grammar& g, const std::string& what) {
  return std::make_shared<const Nfa>(compile_nfa(g, what));
}

}  // namespace

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what)
    : vocab_(std::move(vocab)), automaton_(build_nfa(g, what)), start_(automaton_.start()) {}

int32_t CompiledGrammar::advance(int32_t state, std::string_view bytes) {
  std::lock_guard lock(mu_);
  for (char c : bytes) {
    if (state == Automaton::kDead) break;
    state = automaton_.next(state, static_cast<uint8_t>(c));
  }
  return state;
}

bool CompiledGrammar::accepting(int32_t state) {
  std::lock_guard lock(mu_);
  return automaton_.accepting(state);
}

int32_t CompiledGrammar::bytes_to_accept(int32_t state) {
  std::lock_guard lock(mu_);
  return automaton_.bytes_to_accept(state);
}

bool CompiledGrammar::can_continue(int32_t state) {
  std::lock_guard lock(mu_);
  return automaton_.can_continue(state);
}

const Vocabulary::ByteSet& CompiledGrammar::loop_bytes(int32_t state) {
  auto it = loops_.find(state);
  if (it != loops_.end()) return it->second;
  Vocabulary::ByteSet loops{};
  // Most subtrees hold letters and spaces: a state that does not loop on them gains nothing
  // from the other 254 transitions (and counted repeats would build states for them all).
  if (automaton_.next(state, 'e') != state || automaton_.next(state, ' ') != state)
    return loops_.emplace(state, loops).first->second;
  for (int b = 0; b < 256; ++b)
    if (automaton_.next(state, static_cast<uint8_t>(b)) == state) loops[b >> 6] |= uint64_t(1) << (b & 63);
  return loops_.emplace(state, loops).first->second;
}

CompiledGrammar::Mask CompiledGrammar::walk(int32_t state, int32_t budget) {
  const Vocabulary& v = *vocab_;
  Mask m;
  m.words.assign(static_cast<size_t>((v.size() + 31) / 32), 0u);
  const auto& nodes = v.nodes();
  const auto& edges = v.edges();
  const auto& node_tokens = v.node_tokens();
  auto allow = [&](int32_t id) {
    m.words[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    ++m.count;
  };
  const int32_t deep_above = automaton_.bytes_to_accept(state) + kDeepMargin;
  bool deep_overflow = false;
  struct Item {
    int32_t node, state;
  };
  std::vector<Item> stack = {{0, state}};
  const auto start = std::chrono::steady_clock::now();
  uint64_t visited = 0;
  while (!stack.empty()) {
    // A spec whose automaton is costly to explore must not hold a step for long.
    if ((++visited & 4095) == 0 && std::chrono::steady_clock::now() - start > kMaxMaskTime) {
      throw GrammarError("grammar", fmt::format("computing one token mask took more than {} ms; the constraint is too "
                                                "complex",
                                                std::chrono::duration_cast<std::chrono::milliseconds>(kMaxMaskTime).count()));
    }
    const Item it = stack.back();
    stack.pop_back();
    const Vocabulary::TrieNode& n = nodes[static_cast<size_t>(it.node)];
    for (int32_t e = n.first_edge; e < n.first_edge + n.num_edges; ++e) {
      const Vocabulary::TrieEdge& edge = edges[static_cast<size_t>(e)];
      const int32_t next = automaton_.next(it.state, edge.byte);
      if (next == Automaton::kDead) continue;
      const Vocabulary::TrieNode& child = nodes[static_cast<size_t>(edge.child)];
      if (child.num_edges > 0) {
        const Vocabulary::ByteSet& below = v.subtree_bytes(edge.child);
        const Vocabulary::ByteSet& loops = loop_bytes(next);
        if ((below[0] & ~loops[0]) == 0 && (below[1] & ~loops[1]) == 0 && (below[2] & ~loops[2]) == 0 &&
            (below[3] & ~loops[3]) == 0) {
          // Every token of the subtree ends in `next`.
          const int32_t to_accept = automaton_.bytes_to_accept(next);
          if (budget >= 0 && to_accept > budget) continue;
          m.worst_to_accept = std::max(m.worst_to_accept, to_accept);
          const int32_t end = v.tokens_before(v.subtree_end(edge.child));
          for (int32_t k = child.first_token; k < end; ++k) {
            const int32_t id = node_tokens[static_cast<size_t>(k)];
            allow(id);
            if (budget < 0 && to_accept > deep_above && !deep_overflow) {
              if (m.deep.size() < kMaxDeepTokens) m.deep.emplace_back(id, to_accept);
              else deep_overflow = true;
            }
          }
          continue;
        }
      }
      if (child.num_tokens > 0) {
        const int32_t to_accept = automaton_.bytes_to_accept(next);
        if (budget < 0 || to_accept <= budget) {
          m.worst_to_accept = std::max(m.worst_to_accept, to_accept);
          for (int32_t k = 0; k < child.num_tokens; ++k) {
            const int32_t id = node_tokens[static_cast<size_t>(child.first_token + k)];
            allow(id);
            if (budget < 0 && to_accept > deep_above && !deep_overflow) {
              if (m.deep.size() < kMaxDeepTokens) m.deep.emplace_back(id, to_accept);
              else deep_overflow = true;
            }
          }
        }
      }
      if (child.num_edges > 0) stack.push_back({edge.child, next});
    }
  }
  if (automaton_.accepting(state)) {
    for (int32_t id : v.eos_ids())
      if (id >= 0 && id < v.size()) allow(id);
  }
  if (deep_overflow) m.deep.clear(), m.deep.shrink_to_fit(), m.worst_to_accept = Nfa::kUnreachable;
  return m;
}

int64_t CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> words, int remaining_tokens) {
  std::lock_guard lock(mu_);
  auto it = masks_.find(state);
  if (it == masks_.end()) {
    Mask m = walk(state, -1);
    const size_t bytes = m.words.size() * sizeof(uint32_t);
    if (mask_bytes_ + bytes > kMaskCacheBytes) {
      masks_.clear();
      mask_bytes_ = 0;
    }
    mask_bytes_ += bytes;
    it = masks_.emplace(state, std::move(m)).first;
  }
  const Mask& cached = it->second;
  const size_t n = std::min(words.size(), cached.words.size());
  // After this token, remaining_tokens - 1 tokens of at least one byte each must complete it.
  const int32_t budget = remaining_tokens - 1;
  if (cached.worst_to_accept <= budget || remaining_tokens <= 0) {
    std::memcpy(words.data(), cached.words.data(), n * sizeof(uint32_t));
    return cached.count;
  }
  if (budget >= automaton_.bytes_to_accept(state) + kDeepMargin && cached.worst_to_accept < Nfa::kUnreachable) {
    // Only structure-opening tokens can overrun the budget: take those out of the cached mask.
    std::memcpy(words.data(), cached.words.data(), n * sizeof(uint32_t));
    int64_t count = cached.count;
    for (auto [id, to_accept] : cached.deep) {
      if (to_accept <= budget) continue;
      words[static_cast<size_t>(id) >> 5] &= ~(1u << (id & 31));
      --count;
    }
    if (count > 0) return count;
    std::memcpy(words.data(), cached.words.data(), n * sizeof(uint32_t));
    return cached.count;
  }
  Mask within = walk(state, budget);
  const Mask& use = within.count > 0 ? within : cached;  // nothing completes in time: let it run out
  std::memcpy(words.data(), use.words.data(), n * sizeof(uint32_t));
  return use.count;
}

}  // namespace m3::grammar
