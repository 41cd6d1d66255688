#include "grammar/automaton.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {

size_t Automaton::KeyHash::operator()(const std::vector<int32_t>& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t v : k) h = (h ^ static_cast<uint32_t>(v)) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

Automaton::Automaton(std::shared_ptr<const Nfa> nfa) : nfa_(std::move(nfa)) {
  std::array<bool, 257> cut{};
  for (const NfaState& st : nfa_->states) {
    for (const ByteEdge& e : st.bytes) cut[e.lo] = cut[e.hi + 1] = true;
  }
  uint8_t cls = 0;
  for (int b = 0; b < 256; ++b) {
    if (b > 0 && cut[static_cast<size_t>(b)]) ++cls;
    byte_class_[static_cast<size_t>(b)] = cls;
  }
  class_bytes_.resize(static_cast<size_t>(cls) + 1);
  for (int b = 0; b < 256; ++b) class_bytes_[byte_class_[static_cast<size_t>(b)]].push_back(static_cast<uint8_t>(b));
  std::vector<std::vector<int32_t>> configs;
  bool accepting = false;
  close({nfa_->rule_start[nfa_->start_rule]}, configs, &accepting);
  start_ = intern(std::move(configs), accepting);
}

bool Automaton::live(const std::vector<int32_t>& config) const {
  for (int32_t s : config)
    if (nfa_->min_to_accept[s] >= Nfa::kUnreachable) return false;
  return true;
}

void Automaton::close(std::vector<int32_t> config, std::vector<std::vector<int32_t>>& out, bool* accepting) const {
  std::set<std::vector<int32_t>> seen;
  std::vector<std::vector<int32_t>> work;
  work.push_back(std::move(config));
  while (!work.empty()) {
    std::vector<int32_t> c = std::move(work.back());
    work.pop_back();
    if (!live(c) || !seen.insert(c).second) continue;
    if (seen.size() > static_cast<size_t>(kMaxConfigsPerState) * 4) {
      throw GrammarError("grammar", "the grammar is too ambiguous to match (too many parses of one prefix)");
    }
    const int32_t s = c.back();
    const NfaState& st = nfa_->states[static_cast<size_t>(s)];
    if (!st.bytes.empty()) out.push_back(c);
    for (int32_t t : st.eps) {
      std::vector<int32_t> c2 = c;
      c2.back() = t;
      work.push_back(std::move(c2));
    }
    if (st.call >= 0 && static_cast<int32_t>(c.size()) < kMaxStackDepth) {
      std::vector<int32_t> c2 = c;
      c2.back() = st.ret;
      c2.push_back(nfa_->rule_start[static_cast<size_t>(st.call)]);
      work.push_back(std::move(c2));
    }
    if (s == nfa_->rule_accept[static_cast<size_t>(st.rule)]) {
      if (c.size() == 1) {
        *accepting = true;
      } else {
        std::vector<int32_t> c2 = c;
        c2.pop_back();  // back at the caller's return state
        work.push_back(std::move(c2));
      }
    }
  }
}

int32_t Automaton::intern(std::vector<std::vector<int32_t>> configs, bool accepting) {
  if (configs.empty() && !accepting) return kDead;
  std::sort(configs.begin(), configs.end());
  configs.erase(std::unique(configs.begin(), configs.end()), configs.end());
  if (static_cast<int32_t>(configs.size()) > kMaxConfigsPerState) {
    throw GrammarError("grammar", "the grammar is too ambiguous to match (too many parses of one prefix)");
  }
  std::vector<int32_t> key;
  key.push_back(accepting ? 1 : 0);
  int32_t to_accept = accepting ? 0 : Nfa::kUnreachable;
  int32_t stack_depth = 1;
  for (const auto& c : configs) {
    stack_depth = std::max(stack_depth, static_cast<int32_t>(c.size()));
    key.push_back(static_cast<int32_t>(c.size()));
    key.insert(key.end(), c.begin(), c.end());
    int32_t d = 0;
    for (int32_t s : c) d += nfa_->min_to_accept[static_cast<size_t>(s)];
    to_accept = std::min(to_accept, d);
  }
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  if (static_cast<int32_t>(states_.size()) >= kMaxAutomatonStates) {
    throw GrammarError("grammar", fmt::format("the constraint's automaton grew past {} states", kMaxAutomatonStates));
  }
  State st;
  st.key = key;
  st.accepting = accepting;
  st.can_continue = !configs.empty();
  st.to_accept = to_accept;
  st.stack_depth = stack_depth;
  st.next = std::make_unique<int32_t[]>(256);
  std::fill(st.next.get(), st.next.get() + 256, kUnknown);
  const auto id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(st));
  index_.emplace(std::move(key), id);
  return id;
}

int32_t Automaton::fill_next(int32_t state, uint8_t byte) {
  const int32_t to = compute_next(state, byte);
  int32_t* next = states_[static_cast<size_t>(state)].next.get();  // after compute_next: states_ may have moved
  for (uint8_t b : class_bytes_[byte_class_[byte]]) next[b] = to;
  return to;
}

const Automaton::Closure& Automaton::bottom_closure(int32_t nfa_state) {
  const auto i = static_cast<size_t>(nfa_state);
  if (bottom_closures_.size() <= i) bottom_closures_.resize(nfa_->states.size());
  if (!bottom_closures_[i]) {
    auto c = std::make_unique<Closure>();
    close({nfa_state}, c->configs, &c->accepting);
    bottom_closures_[i] = std::move(c);
  }
  return *bottom_closures_[i];
}

int32_t Automaton::compute_next(int32_t state, uint8_t byte) {
  // Decode the configurations from the key (a copy: interning may move states_).
  const std::vector<int32_t> key = states_[static_cast<size_t>(state)].key;
  std::vector<std::vector<int32_t>> out;
  bool accepting = false;
  for (size_t i = 1; i < key.size();) {
    const auto len = static_cast<size_t>(key[i]);
    const int32_t top = key[i + len];
    const NfaState& st = nfa_->states[static_cast<size_t>(top)];
    for (const ByteEdge& e : st.bytes) {
      if (byte < e.lo || byte > e.hi) continue;
      if (len == 1) {
        const Closure& c = bottom_closure(e.to);
        out.insert(out.end(), c.configs.begin(), c.configs.end());
        accepting = accepting || c.accepting;
        continue;
      }
      std::vector<int32_t> c2(key.begin() + static_cast<std::ptrdiff_t>(i + 1),
                              key.begin() + static_cast<std::ptrdiff_t>(i + 1 + len));
      c2.back() = e.to;
      close(std::move(c2), out, &accepting);
    }
    i += 1 + len;
  }
  return intern(std::move(out), accepting);
}

}  // namespace m3::grammar
