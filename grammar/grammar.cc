#include "grammar/grammar.h"

#include <algorithm>

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {

CodePointRanges normalize_ranges(CodePointRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodePointRanges out;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    hi = std::min(hi, kMaxCodePoint);
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodePointRanges complement_ranges(const CodePointRanges& ranges) {
  CodePointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize_ranges(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

int32_t Grammar::push(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<int32_t>(nodes_.size() - 1);
}

int32_t Grammar::empty() { return push(Node{}); }

int32_t Grammar::chars(CodePointRanges ranges) {
  Node n;
  n.kind = Node::Kind::kChars;
  n.chars = normalize_ranges(std::move(ranges));
  return push(std::move(n));
}

int32_t Grammar::byte_string(std::string_view utf8) {
  std::vector<int32_t> parts;
  for (uint32_t cp : decode_utf8(utf8, "literal")) parts.push_back(chars({{cp, cp}}));
  return seq(std::move(parts));
}

int32_t Grammar::seq(std::vector<int32_t> parts) {
  if (parts.size() == 1) return parts[0];
  Node n;
  n.kind = parts.empty() ? Node::Kind::kEmpty : Node::Kind::kSeq;
  n.kids = std::move(parts);
  return push(std::move(n));
}

int32_t Grammar::alt(std::vector<int32_t> options) {
  if (options.size() == 1) return options[0];
  Node n;
  n.kind = Node::Kind::kAlt;
  n.kids = std::move(options);  // no options: the empty language
  return push(std::move(n));
}

int32_t Grammar::repeat(int32_t node, int32_t min, int32_t max) {
  if (min == 1 && max == 1) return node;
  Node n;
  n.kind = Node::Kind::kRepeat;
  n.kids = {node};
  n.min = min;
  n.max = max;
  return push(std::move(n));
}

int32_t Grammar::ref(int32_t rule) {
  Node n;
  n.kind = Node::Kind::kRef;
  n.rule = rule;
  return push(std::move(n));
}

int32_t Grammar::add_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::set_body(int32_t rule, int32_t body) { rules_[static_cast<size_t>(rule)].body = body; }

std::vector<uint32_t> decode_utf8(std::string_view text, const std::string& what) {
  std::vector<uint32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > text.size()) throw GrammarError(what, fmt::format("{}: invalid UTF-8 at byte {}", what, i));
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) throw GrammarError(what, fmt::format("{}: invalid UTF-8 at byte {}", what, i));
      cp = (cp << 6) | (c & 0x3F);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

}  // namespace m3::grammar
