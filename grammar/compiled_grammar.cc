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

bool subset(const TokenTrie::ByteSet& a, const TokenTrie::ByteSet& b) {
  return (a[0] & ~b[0]) == 0 && (a[1] & ~b[1]) == 0 && (a[2] & ~b[2]) == 0 && (a[3] & ~b[3]) == 0;
}

}  // namespace

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab, const std::string& what,
                                 PrecomputeLimits precompute)
    : vocab_(std::move(vocab)), automaton_(build_nfa(g, what)), start_(automaton_.start()) {
  ahead_.queue.push_back(start_);
  ahead_.seen.assign(static_cast<size_t>(start_) + 1, 0);
  ahead_.seen[static_cast<size_t>(start_)] = 1;
  const auto deadline = std::chrono::steady_clock::now() + precompute.at_construction;
  bool more = true;
  while (more && std::chrono::steady_clock::now() < deadline) more = precompute_one();
  if (more && precompute.in_background.count() > 0) {
    ahead_.running = true;
    precompute_thread_ = std::jthread([this, limit = precompute.in_background](std::stop_token stop) {
      precompute_in_background(limit, stop);
    });
  }
}

CompiledGrammar::~CompiledGrammar() = default;

std::unique_lock<std::mutex> CompiledGrammar::lock_for_sequence() {
  sequences_waiting_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(mu_);
  sequences_waiting_.fetch_sub(1, std::memory_order_relaxed);
  return lock;
}

void CompiledGrammar::wait_precomputed() {
  std::lock_guard lock(thread_mu_);
  if (precompute_thread_.joinable()) precompute_thread_.join();
}

bool CompiledGrammar::wait_precomputed_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return ahead_done_.wait_for(lock, timeout, [&] { return !ahead_.running; });
}

int32_t CompiledGrammar::advance(int32_t state, std::string_view bytes) {
  auto lock = lock_for_sequence();
  for (char c : bytes) {
    if (state == Automaton::kDead) break;
    state = automaton_.next(state, static_cast<uint8_t>(c));
  }
  return state;
}

bool CompiledGrammar::accepting(int32_t state) {
  auto lock = lock_for_sequence();
  return automaton_.accepting(state);
}

int32_t CompiledGrammar::bytes_to_accept(int32_t state) {
  auto lock = lock_for_sequence();
  return automaton_.bytes_to_accept(state);
}

bool CompiledGrammar::can_continue(int32_t state) {
  auto lock = lock_for_sequence();
  return automaton_.can_continue(state);
}

size_t CompiledGrammar::cached_masks() {
  auto lock = lock_for_sequence();
  return masks_.size();
}

size_t CompiledGrammar::cached_mask_bytes() {
  auto lock = lock_for_sequence();
  return mask_bytes_;
}

const ByteChains::Chain* CompiledGrammar::whole_subtree(const TokenTrie& trie, int32_t child, int32_t state) {
  if (trie.tokens_before(trie.subtree_end(child)) - trie.nodes()[static_cast<size_t>(child)].first_token < kMinChainTokens) {
    return nullptr;
  }
  const int32_t height = trie.subtree_height(child);
  for (size_t lead = 0; lead < ByteChains::kLeadBytes.size(); ++lead) {
    const ByteChains::Chain& c = chains_.chain(state, lead);
    if (c.length == 0 || (height > c.length && !c.endless)) continue;
    if (subset(trie.subtree_bytes(child), c.bytes[static_cast<size_t>(std::min(height, c.length) - 1)])) return &c;
  }
  return nullptr;
}

void CompiledGrammar::add_end(Mask& m, int32_t state) {
  const auto i = static_cast<size_t>(state);
  if (end_marks_.size() <= i) end_marks_.resize(std::max(i + 1, end_marks_.size() * 2), 0);
  if (end_marks_[i] == mask_number_) return;
  end_marks_[i] = mask_number_;
  m.ends.push_back(state);
}

void CompiledGrammar::walk(const TokenTrie& trie, int32_t state, int32_t budget, Mask& m,
                           std::chrono::milliseconds limit) {
  const auto& nodes = trie.nodes();
  const auto& edges = trie.edges();
  const auto& node_tokens = trie.node_tokens();
  auto allow = [&](int32_t id) {
    m.words[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    ++m.count;
  };
  auto reached = [&](int32_t s) {
    if (budget < 0) add_end(m, s);
  };
  const int32_t here = automaton_.bytes_to_accept(state);
  auto note = [&](int32_t id, int32_t to_accept) {
    if (budget >= 0 || to_accept == here) return;
    auto& list = to_accept > here ? m.further : m.nearer;
    bool& listed = to_accept > here ? m.further_listed : m.nearer_listed;
    if (!listed) return;
    if (list.size() < kMaxListedTokens) list.emplace_back(id, to_accept);
    else listed = false, list.clear(), list.shrink_to_fit();
  };
  struct Item {
    int32_t node, state;
  };
  std::vector<Item> stack = {{0, state}};
  const auto start = std::chrono::steady_clock::now();
  uint64_t visited = 0;
  while (!stack.empty()) {
    // A spec whose automaton is costly to explore must not hold a step for long.
    if ((++visited & 4095) == 0 && std::chrono::steady_clock::now() - start > limit) {
      throw GrammarError("grammar", fmt::format("computing one token mask took more than {} ms; the constraint is too "
                                                "complex",
                                                limit.count()));
    }
    const Item it = stack.back();
    stack.pop_back();
    const TokenTrie::Node& n = nodes[static_cast<size_t>(it.node)];
    for (int32_t e = n.first_edge; e < n.first_edge + n.num_edges; ++e) {
      const TokenTrie::Edge& edge = edges[static_cast<size_t>(e)];
      const int32_t next = automaton_.next(it.state, edge.byte);
      if (next == Automaton::kDead) continue;
      const TokenTrie::Node& child = nodes[static_cast<size_t>(edge.child)];
      const ByteChains::Chain* along = child.num_edges > 0 ? whole_subtree(trie, edge.child, next) : nullptr;
      if (along) {
        // Every token of the subtree ends on the chain, as far from complete as `next` is.
        const int32_t to_accept = automaton_.bytes_to_accept(next);
        if (budget >= 0 && to_accept > budget) continue;
        m.worst_to_accept = std::max(m.worst_to_accept, to_accept);
        reached(next);
        for (int32_t j = 0, h = std::min(trie.subtree_height(edge.child), along->length); j < h; ++j)
          reached(along->states[static_cast<size_t>(j)]);
        const int32_t end = trie.tokens_before(trie.subtree_end(edge.child));
        for (int32_t k = child.first_token; k < end; ++k) {
          const int32_t id = node_tokens[static_cast<size_t>(k)];
          allow(id);
          note(id, to_accept);
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
            note(id, to_accept);
          }
        }
      }
      if (child.num_edges > 0) stack.push_back({edge.child, next});
    }
  }
}

CompiledGrammar::Mask CompiledGrammar::compute_mask(int32_t state, int32_t budget, std::chrono::milliseconds limit) {
  if (++mask_number_ == 0) std::fill(end_marks_.begin(), end_marks_.end(), 0u), mask_number_ = 1;
  const Vocabulary& v = *vocab_;
  Mask m;
  // A class's tokens go in bulk (for a budget: when all of them complete within it); the
  // lists of tokens that move away from or toward completion cannot name them, so a budget
  // that would need them walks instead.
  const int32_t here = automaton_.bytes_to_accept(state);
  for (int32_t c = 0; c < kNumTextClasses; ++c) {
    const auto cls = static_cast<TextClass>(c);
    const TextRuns::Run& run = runs_[static_cast<size_t>(c)].run(state);
    if (!run.uniform) continue;
    int32_t worst = -1, nearest = Nfa::kUnreachable;
    for (int32_t k = 1; k <= run.chars; ++k) {
      if (v.class_count_upto(cls, k) == v.class_count_upto(cls, k - 1)) continue;  // no token this long
      worst = std::max(worst, run.max_to_accept[static_cast<size_t>(k - 1)]);
      nearest = std::min(nearest, run.min_to_accept[static_cast<size_t>(k - 1)]);
    }
    if (budget >= 0 && worst > budget) continue;
    const auto bulk = v.class_upto(cls, run.chars);
    m.words.assign(bulk.begin(), bulk.end());
    m.count = v.class_count_upto(cls, run.chars);
    m.worst_to_accept = std::max(0, worst);
    if (worst > here) m.further_listed = false;
    if (nearest < here && worst >= 0) m.nearer_listed = false;
    if (budget < 0)
      for (int32_t e : run.ends) add_end(m, e);
    walk(v.outside(cls), state, budget, m, limit);
    break;
  }
  if (m.words.empty()) {
    m.words.assign(static_cast<size_t>((v.size() + 31) / 32), 0u);
    walk(v.trie(), state, budget, m, limit);
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
  uint64_t hash = 0xcbf29ce484222325ull;
  for (uint32_t w : m.words) hash = (hash ^ w) * 0x100000001b3ull;
  size_t bytes = (m.further.size() + m.nearer.size()) * sizeof(std::pair<int32_t, int32_t>) + m.ends.size() * sizeof(int32_t);
  auto same = distinct_words_.find(hash);
  bool shared = same != distinct_words_.end() && *same->second == m.words;
  const size_t word_bytes = m.words.size() * sizeof(uint32_t);
  if (mask_bytes_ + bytes + (shared ? 0 : word_bytes) > kMaskCacheBytes) {
    masks_.clear();
    distinct_words_.clear();
    mask_bytes_ = 0;
    shared = false;
  }
  mask_bytes_ += bytes + (shared ? 0 : word_bytes);
  if (shared) {
    m.cached_words = same->second;
  } else {
    m.cached_words = std::make_shared<const std::vector<uint32_t>>(std::move(m.words));
    distinct_words_.insert_or_assign(hash, m.cached_words);
  }
  m.words = {};
  return masks_.insert_or_assign(state, std::move(m)).first->second;
}

bool CompiledGrammar::precompute_one() {
  // Far from the limits only: what is computed ahead must not be what makes a sequence fail.
  if (mask_bytes_ >= kPrecomputeBytes || automaton_.num_states() >= static_cast<size_t>(kMaxAutomatonStates) / 8) {
    return false;
  }
  int32_t s = Automaton::kDead;
  while (s == Automaton::kDead && !ahead_.next_of_sequences.empty()) {
    const int32_t e = ahead_.next_of_sequences.back();
    ahead_.next_of_sequences.pop_back();
    if (!masks_.count(e)) s = e;
  }
  if (s == Automaton::kDead) {
    if (ahead_.queue.empty()) return false;
    s = ahead_.queue.front();
    ahead_.queue.pop_front();
  }
  auto it = masks_.find(s);
  if (it == masks_.end()) {
    try {
      cache(s, compute_mask(s, -1, kMaxMaskTimeAhead));
    } catch (const GrammarError&) {
      return false;  // a limit met ahead of time: a sequence that goes there meets it again and fails with it
    }
    it = masks_.find(s);
    if (it == masks_.end()) return false;  // the cache was dropped to make room
  }
  const std::vector<int32_t> ends = it->second.ends;
  for (int32_t e : ends) {
    if (automaton_.stack_depth(e) > kPrecomputeStackDepth) continue;
    if (ahead_.seen.size() <= static_cast<size_t>(e)) ahead_.seen.resize(static_cast<size_t>(e) + 1, 0);
    if (ahead_.seen[static_cast<size_t>(e)]) continue;
    ahead_.seen[static_cast<size_t>(e)] = 1;
    ahead_.queue.push_back(e);
  }
  return true;
}

void CompiledGrammar::precompute_in_background(std::chrono::milliseconds limit, std::stop_token stop) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!stop.stop_requested() && std::chrono::steady_clock::now() < deadline) {
    // A sequence waiting for the lock goes first: one mask ahead is worth less than its step.
    while (sequences_waiting_.load(std::memory_order_relaxed) > 0 && !stop.stop_requested()) std::this_thread::yield();
    std::lock_guard lock(mu_);
    if (!precompute_one()) break;
  }
  std::lock_guard lock(mu_);
  ahead_.running = false;
  ahead_.next_of_sequences = {};
  ahead_done_.notify_all();
}

void CompiledGrammar::ask_ahead(const Mask& m) {
  if (!ahead_.running) return;
  if (ahead_.next_of_sequences.size() + m.ends.size() > kMaxNextOfSequences) ahead_.next_of_sequences.clear();
  for (int32_t e : m.ends)
    if (automaton_.stack_depth(e) <= kPrecomputeStackDepth && !masks_.count(e)) ahead_.next_of_sequences.push_back(e);
}

int64_t CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> words, int remaining_tokens) {
  auto lock = lock_for_sequence();
  auto it = masks_.find(state);
  const Mask& cached = it != masks_.end() ? it->second : cache(state, compute_mask(state, -1));
  ask_ahead(cached);
  const std::vector<uint32_t>& all = *cached.cached_words;
  const size_t n = std::min(words.size(), all.size());
  // After this token, remaining_tokens - 1 tokens of at least one byte each must complete it.
  const int32_t budget = remaining_tokens - 1;
  const int32_t here = automaton_.bytes_to_accept(state);
  if (cached.worst_to_accept <= budget || remaining_tokens <= 0) {
    std::memcpy(words.data(), all.data(), n * sizeof(uint32_t));
    return cached.count;
  }
  if (budget >= here && cached.further_listed) {
    // Only tokens that open structures can overrun the budget: take those out.
    std::memcpy(words.data(), all.data(), n * sizeof(uint32_t));
    int64_t count = cached.count;
    for (auto [id, to_accept] : cached.further) {
      if (to_accept <= budget) continue;
      words[static_cast<size_t>(id) >> 5] &= ~(1u << (id & 31));
      --count;
    }
    if (count > 0) return count;
    std::memcpy(words.data(), all.data(), n * sizeof(uint32_t));  // nothing completes in time: let it run out
    return cached.count;
  }
  if (budget < here && cached.nearer_listed) {
    // Only tokens that close structures can complete in time.
    std::fill(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(n), 0u);
    int64_t count = 0;
    for (auto [id, to_accept] : cached.nearer) {
      if (to_accept > budget) continue;
      words[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
      ++count;
    }
    if (count > 0) return count;
    std::memcpy(words.data(), all.data(), n * sizeof(uint32_t));
    return cached.count;
  }
  Mask within = compute_mask(state, budget);
  if (within.count == 0) {
    std::memcpy(words.data(), all.data(), n * sizeof(uint32_t));
    return cached.count;
  }
  std::memcpy(words.data(), within.words.data(), n * sizeof(uint32_t));
  return within.count;
}

}  // namespace m3::grammar
