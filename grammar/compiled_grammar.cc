#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {
namespace {

std::shared_ptr<const Nfa> build_nfa(const Grammar& g, const std::string& what) {
  return std::make_shared<const Nfa>(compile_nfa(g, what));
}

bool subset(const TokenTrie::ByteSet& a, const TokenTrie::ByteSet& b) {
  return (a[0] & ~b[0]) == 0 && (a[1] & ~b[1]) == 0 && (a[2] & ~b[2]) == 0 && (a[3] & ~b[3]) == 0;
}

}  // namespace

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what,
                                 std::chrono::milliseconds precompute_time)
    : vocab_(std::move(vocab)), automaton_(build_nfa(g, what)), start_(automaton_.start()) {
  precompute(precompute_time);
}

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

size_t CompiledGrammar::cached_masks() {
  std::lock_guard lock(mu_);
  return masks_.size();
}

const TokenTrie::ByteSet& CompiledGrammar::loop_bytes(int32_t state) {
  const auto i = static_cast<size_t>(state);
  if (loops_.size() <= i) loops_.resize(i + 1);
  if (loops_[i]) return *loops_[i];
  auto loops = std::make_unique<TokenTrie::ByteSet>();
  // Most subtrees hold letters: a state that does not loop on one gains nothing from the other
  // transitions (and counted repeats would build states for them all).
  if (automaton_.next(state, 'e') == state || automaton_.next(state, '0') == state) {
    for (int b = 0; b < 256; ++b)
      if (automaton_.next(state, static_cast<uint8_t>(b)) == state) (*loops)[b >> 6] |= uint64_t(1) << (b & 63);
  }
  loops_[i] = std::move(loops);
  return *loops_[i];
}

void CompiledGrammar::walk(const TokenTrie& trie, int32_t state, int32_t budget, Mask& m, std::vector<int32_t>* ends) {
  const auto& nodes = trie.nodes();
  const auto& edges = trie.edges();
  const auto& node_tokens = trie.node_tokens();
  auto allow = [&](int32_t id) {
    m.words[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    ++m.count;
  };
  auto reached = [&](int32_t s) {
    if (ends && (ends->empty() || ends->back() != s)) ends->push_back(s);
  };
  const int32_t deep_above = automaton_.bytes_to_accept(state) + kDeepMargin;
  bool deep_overflow = false;
  auto note_deep = [&](int32_t id, int32_t to_accept) {
    if (budget >= 0 || to_accept <= deep_above || deep_overflow) return;
    if (m.deep.size() < kMaxDeepTokens) m.deep.emplace_back(id, to_accept);
    else deep_overflow = true;
  };
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
    const TokenTrie::Node& n = nodes[static_cast<size_t>(it.node)];
    for (int32_t e = n.first_edge; e < n.first_edge + n.num_edges; ++e) {
      const TokenTrie::Edge& edge = edges[static_cast<size_t>(e)];
      const int32_t next = automaton_.next(it.state, edge.byte);
      if (next == Automaton::kDead) continue;
      const TokenTrie::Node& child = nodes[static_cast<size_t>(edge.child)];
      if (child.num_edges > 0 && subset(trie.subtree_bytes(edge.child), loop_bytes(next))) {
        // Every token of the subtree ends in `next`.
        const int32_t to_accept = automaton_.bytes_to_accept(next);
        if (budget >= 0 && to_accept > budget) continue;
        m.worst_to_accept = std::max(m.worst_to_accept, to_accept);
        reached(next);
        const int32_t end = trie.tokens_before(trie.subtree_end(edge.child));
        for (int32_t k = child.first_token; k < end; ++k) {
          const int32_t id = node_tokens[static_cast<size_t>(k)];
          allow(id);
          note_deep(id, to_accept);
        }
        continue;
      }
      if (child.num_tokens > 0) {
        const int32_t to_accept = automaton_.bytes_to_accept(next);
        if (budget < 0 || to_accept <= budget) {
          m.worst_to_accept = std::max(m.worst_to_accept, to_accept);
          reached(next);
          for (int32_t k = 0; k < child.num_tokens; ++k) {
            const int32_t id = node_tokens[static_cast<size_t>(child.first_token + k)];
            allow(id);
            note_deep(id, to_accept);
          }
        }
      }
      if (child.num_edges > 0) stack.push_back({edge.child, next});
    }
  }
  if (deep_overflow) m.deep.clear(), m.deep.shrink_to_fit(), m.worst_to_accept = Nfa::kUnreachable;
}

CompiledGrammar::Mask CompiledGrammar::compute_mask(int32_t state, int32_t budget, std::vector<int32_t>* ends) {
  const Vocabulary& v = *vocab_;
  Mask m;
  // A class's tokens go in bulk when none of them could be one the budget (or the deep list)
  // must single out: their ends are at most `worst` from complete.
  const int32_t limit = budget >= 0 ? budget : automaton_.bytes_to_accept(state) + kDeepMargin;
  for (int32_t c = 0; c < kNumTextClasses; ++c) {
    const auto cls = static_cast<TextClass>(c);
    const TextRuns::Run& run = runs_[static_cast<size_t>(c)].run(state);
    if (!run.uniform) continue;
    int32_t worst = -1;
    for (int32_t k = 1; k <= run.chars; ++k)
      if (v.class_count_upto(cls, k) > v.class_count_upto(cls, k - 1)) worst = std::max(worst, run.max_to_accept[static_cast<size_t>(k - 1)]);
    if (worst > limit) continue;
    const auto bulk = v.class_upto(cls, run.chars);
    m.words.assign(bulk.begin(), bulk.end());
    m.count = v.class_count_upto(cls, run.chars);
    m.worst_to_accept = std::max(0, worst);
    if (ends) ends->insert(ends->end(), run.ends.begin(), run.ends.end());
    walk(v.outside(cls), state, budget, m, ends);
    break;
  }
  if (m.words.empty()) {
    m.words.assign(static_cast<size_t>((v.size() + 31) / 32), 0u);
    walk(v.trie(), state, budget, m, ends);
  }
  if (automaton_.accepting(state)) {
    for (int32_t id : v.eos_ids()) {
      if (id < 0 || id >= v.size()) continue;
      uint32_t& w = m.words[static_cast<size_t>(id) >> 5];
      if (!(w & (1u << (id & 31)))) w |= 1u << (id & 31), ++m.count;
    }
  }
  return m;
}

const CompiledGrammar::Mask& CompiledGrammar::cache(int32_t state, Mask m) {
  const size_t bytes = m.words.size() * sizeof(uint32_t);
  if (mask_bytes_ + bytes > kMaskCacheBytes) {
    masks_.clear();
    mask_bytes_ = 0;
  }
  mask_bytes_ += bytes;
  return masks_.insert_or_assign(state, std::move(m)).first->second;
}

void CompiledGrammar::precompute(std::chrono::milliseconds limit) {
  if (limit.count() <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::deque<int32_t> queue = {start_};
  std::vector<char> queued;
  auto mark = [&](int32_t s) {
    if (queued.size() <= static_cast<size_t>(s)) queued.resize(static_cast<size_t>(s) + 1, 0);
    const bool first = !queued[static_cast<size_t>(s)];
    queued[static_cast<size_t>(s)] = 1;
    return first;
  };
  mark(start_);
  std::vector<int32_t> ends;
  try {
    while (!queue.empty() && std::chrono::steady_clock::now() < deadline &&
           mask_bytes_ < kMaskCacheBytes / 2 && automaton_.num_states() < static_cast<size_t>(kMaxAutomatonStates) / 4) {
      const int32_t s = queue.front();
      queue.pop_front();
      ends.clear();
      cache(s, compute_mask(s, -1, &ends));
      for (int32_t e : ends)
        if (automaton_.stack_depth(e) <= kPrecomputeStackDepth && mark(e)) queue.push_back(e);
    }
  } catch (const GrammarError&) {
    // A limit met ahead of time: a sequence that goes there meets it again and fails with it.
  }
}

int64_t CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> words, int remaining_tokens) {
  std::lock_guard lock(mu_);
  auto it = masks_.find(state);
  const Mask& cached = it != masks_.end() ? it->second : cache(state, compute_mask(state, -1, nullptr));
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
  Mask within = compute_mask(state, budget, nullptr);
  const Mask& use = within.count > 0 ? within : cached;  // nothing completes in time: let it run out
  std::memcpy(words.data(), use.words.data(), n * sizeof(uint32_t));
  return use.count;
}

}  // namespace m3::grammar
