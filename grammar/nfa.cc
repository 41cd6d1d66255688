#include "grammar/nfa.h"

#include <algorithm>

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {
namespace {

// Byte sequences of the UTF-8 encodings of [lo, hi] (one code-point length at a time; every
// position a byte range), as in the usual range-splitting construction.
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  if (lo > hi) return;
  // No surrogates.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  // One encoded length at a time.
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t end : kLengthEnds) {
    if (lo <= end && hi > end) {
      utf8_sequences(lo, end, out);
      utf8_sequences(end + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  // Split until every byte position is an independent range.
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = utf8_encode(lo, a);
  utf8_encode(hi, b);
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

class Builder {
 public:
  Builder(const Grammar& g, Nfa& nfa, const std::string& what) : g_(g), nfa_(nfa), what_(what) {}

  int32_t add_state(int32_t rule) {
    if (static_cast<int32_t>(nfa_.states.size()) >= kMaxNfaStates) {
      throw GrammarError(what_, fmt::format("{}: too large (more than {} automaton states); simplify it",
                                            what_, kMaxNfaStates));
    }
    NfaState s;
    s.rule = rule;
    nfa_.states.push_back(std::move(s));
    return static_cast<int32_t>(nfa_.states.size() - 1);
  }

  // Builds `node` between fresh states; returns {in, out}.
  std::pair<int32_t, int32_t> build(int32_t node, int32_t rule, int depth = 0) {
    if (depth > 2000) throw GrammarError(what_, fmt::format("{}: nested too deeply", what_));
    const Node& n = g_.node(node);
    const int32_t in = add_state(rule);
    switch (n.kind) {
      case Node::Kind::kEmpty: {
        const int32_t out = add_state(rule);
        nfa_.states[in].eps.push_back(out);
        return {in, out};
      }
      case Node::Kind::kChars: {
        const int32_t out = add_state(rule);
        std::vector<ByteSeq> seqs;
        for (auto [lo, hi] : n.chars) utf8_sequences(lo, hi, seqs);
        for (const ByteSeq& seq : seqs) {
          int32_t from = in;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int32_t to = i + 1 == seq.size() ? out : add_state(rule);
            nfa_.states[from].bytes.push_back({seq[i].first, seq[i].second, to});
            from = to;
          }
        }
        return {in, out};
      }
      case Node::Kind::kSeq: {
        int32_t cur = in;
        for (int32_t kid : n.kids) {
          auto [a, b] = build(kid, rule, depth + 1);
          nfa_.states[cur].eps.push_back(a);
          cur = b;
        }
        return {in, cur};
      }
      case Node::Kind::kAlt: {
        const int32_t out = add_state(rule);
        for (int32_t kid : n.kids) {
          auto [a, b] = build(kid, rule, depth + 1);
          nfa_.states[in].eps.push_back(a);
          nfa_.states[b].eps.push_back(out);
        }
        return {in, out};
      }
      case Node::Kind::kRepeat: {
        int32_t cur = in;
        for (int32_t i = 0; i < n.min; ++i) {
          auto [a, b] = build(n.kids[0], rule, depth + 1);
          nfa_.states[cur].eps.push_back(a);
          cur = b;
        }
        const int32_t out = add_state(rule);
        if (n.max < 0) {
          const int32_t loop = add_state(rule);
          nfa_.states[cur].eps.push_back(loop);
          auto [a, b] = build(n.kids[0], rule, depth + 1);
          nfa_.states[loop].eps.push_back(a);
          nfa_.states[b].eps.push_back(loop);
          nfa_.states[loop].eps.push_back(out);
        } else {
          for (int32_t i = n.min; i < n.max; ++i) {
            nfa_.states[cur].eps.push_back(out);
            auto [a, b] = build(n.kids[0], rule, depth + 1);
            nfa_.states[cur].eps.push_back(a);
            cur = b;
          }
          nfa_.states[cur].eps.push_back(out);
        }
        return {in, out};
      }
      case Node::Kind::kRef: {
        const int32_t out = add_state(rule);
        nfa_.states[in].call = n.rule;
        nfa_.states[in].ret = out;
        return {in, out};
      }
    }
    return {in, in};
  }

 private:
  const Grammar& g_;
  Nfa& nfa_;
  const std::string& what_;
};

// Rules whose text can be empty (a fixpoint over the calls).
std::vector<char> nullable_rules(const Nfa& nfa) {
  const size_t num_rules = nfa.rule_start.size();
  std::vector<char> nullable(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < num_rules; ++r) {
      if (nullable[r]) continue;
      std::vector<char> seen(nfa.states.size(), 0);
      std::vector<int32_t> work = {nfa.rule_start[r]};
      bool reaches = false;
      while (!work.empty() && !reaches) {
        const int32_t s = work.back();
        work.pop_back();
        if (seen[s]) continue;
        seen[s] = 1;
        if (s == nfa.rule_accept[r]) reaches = true;
        const NfaState& st = nfa.states[s];
        for (int32_t t : st.eps) work.push_back(t);
        if (st.call >= 0 && nullable[st.call]) work.push_back(st.ret);
      }
      if (reaches) nullable[r] = changed = 1;
    }
  }
  return nullable;
}

// Left recursion: rule R reaching a call of itself before any byte is read.
void check_left_recursion(const Nfa& nfa, const std::vector<char>& nullable, const std::string& what) {
  const size_t num_rules = nfa.rule_start.size();
  std::vector<std::vector<int32_t>> calls_at_start(num_rules);
  for (size_t r = 0; r < num_rules; ++r) {
    std::vector<char> seen(nfa.states.size(), 0);
    std::vector<int32_t> work = {nfa.rule_start[r]};
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      if (seen[s]) continue;
      seen[s] = 1;
      const NfaState& st = nfa.states[s];
      for (int32_t t : st.eps) work.push_back(t);
      if (st.call >= 0) {
        calls_at_start[r].push_back(st.call);
        if (nullable[st.call]) work.push_back(st.ret);
      }
    }
  }
  // A cycle in "calls at start" is left recursion.
  std::vector<int> color(num_rules, 0);
  std::vector<std::pair<int32_t, size_t>> stack;
  for (size_t root = 0; root < num_rules; ++root) {
    if (color[root]) continue;
    stack.push_back({static_cast<int32_t>(root), 0});
    color[root] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < calls_at_start[r].size()) {
        const int32_t next = calls_at_start[r][i++];
        if (color[next] == 1) {
          throw GrammarError(what, fmt::format("{}: rule '{}' is left-recursive (it can reach itself without "
                                               "reading input); rewrite it with repetition",
                                               what, nfa.rule_names[next]));
        }
        if (color[next] == 0) {
          color[next] = 1;
          stack.push_back({next, 0});
        }
      } else {
        color[r] = 2;
        stack.pop_back();
      }
    }
  }
}

// Shortest text from each state to its rule's accept state, with calls costing their callee's
// shortest text (Bellman-Ford to a fixpoint; states are visited newest first, which follows most
// edges backwards in one pass).
void shortest_to_accept(Nfa& nfa) {
  const int32_t kInf = Nfa::kUnreachable;
  std::vector<int32_t>& d = nfa.min_to_accept;
  d.assign(nfa.states.size(), kInf);
  for (int32_t a : nfa.rule_accept) d[a] = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = nfa.states.size(); i-- > 0;) {
      const NfaState& st = nfa.states[i];
      int32_t best = d[i];
      for (const ByteEdge& e : st.bytes) best = std::min(best, d[e.to] + 1);
      for (int32_t t : st.eps) best = std::min(best, d[t]);
      if (st.call >= 0) best = std::min(best, std::min(kInf, d[nfa.rule_start[st.call]] + d[st.ret]));
      if (best < d[i]) {
        d[i] = best;
        changed = true;
      }
    }
  }
}

}  // namespace

Nfa compile_nfa(const Grammar& g, const std::string& what) {
  Nfa nfa;
  Builder b(g, nfa, what);
  const auto& rules = g.rules();
  nfa.rule_start.resize(rules.size());
  nfa.rule_accept.resize(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    nfa.rule_names.push_back(rules[r].name);
    if (rules[r].body < 0) throw GrammarError(what, fmt::format("{}: rule '{}' is never defined", what, rules[r].name));
    auto [in, out] = b.build(rules[r].body, static_cast<int32_t>(r));
    nfa.rule_start[r] = in;
    nfa.rule_accept[r] = out;
  }
  M3_CHECK(g.start() >= 0 && g.start() < static_cast<int32_t>(rules.size()), "{}: no start rule", what);
  nfa.start_rule = g.start();
  check_left_recursion(nfa, nullable_rules(nfa), what);
  shortest_to_accept(nfa);
  if (nfa.min_to_accept[nfa.rule_start[nfa.start_rule]] >= Nfa::kUnreachable) {
    throw GrammarError(what, fmt::format("{}: matches no text at all", what));
  }
  return nfa;
}

}  // namespace m3::grammar
