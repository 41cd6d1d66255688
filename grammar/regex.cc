#include "grammar/regex.h"

#include <fmt/format.h>

#include "grammar/grammar_error.h"

namespace m3::grammar {
namespace {

const CodePointRanges kDigit = {{'0', '9'}};
const CodePointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodePointRanges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view pattern, const RegexOptions& o)
      : g_(g), o_(o), cps_(decode_utf8(pattern, o.what)) {}

  int32_t parse() {
    bool anchored_start = false, anchored_end = false;
    if (pos_ < cps_.size() && cps_[pos_] == '^') {
      anchored_start = true;
      ++pos_;
    }
    int32_t body = alternation(&anchored_end);
    if (pos_ != cps_.size()) fail(cps_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    if (!o_.search) return body;
    std::vector<int32_t> parts;
    const int32_t any = make_chars({{0, kMaxCodePoint}});
    if (!anchored_start) parts.push_back(g_.star(any));
    parts.push_back(body);
    if (!anchored_end) parts.push_back(g_.star(make_chars({{0, kMaxCodePoint}})));
    return g_.seq(std::move(parts));
  }

 private:
  [[noreturn]] void fail(std::string_view why) const {
    throw GrammarError(o_.what, fmt::format("{}: {} at character {}", o_.what, why, pos_));
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  uint32_t peek() const { return cps_[pos_]; }
  bool eat(uint32_t c) {
    if (!at_end() && peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  int32_t make_chars(const CodePointRanges& r) { return o_.chars ? o_.chars(g_, r) : g_.chars(r); }

  // A trailing $ (only at the very end of the whole pattern) sets *anchored_end.
  int32_t alternation(bool* anchored_end) {
    std::vector<int32_t> options = {sequence(anchored_end)};
    while (eat('|')) options.push_back(sequence(anchored_end));
    return g_.alt(std::move(options));
  }

  int32_t sequence(bool* anchored_end) {
    std::vector<int32_t> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        ++pos_;
        if (!at_end() && peek() != '|' && peek() != ')') fail("'$' is supported only at the end");
        if (depth_ == 0 && anchored_end) *anchored_end = true;
        continue;
      }
      if (peek() == '^') fail("'^' is supported only at the start");
      parts.push_back(quantified());
    }
    return g_.seq(std::move(parts));
  }

  int count() {
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a number in {}");
    int64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRegexRepeat) fail(fmt::format("repeat count above {}", kMaxRegexRepeat));
      ++pos_;
    }
    return static_cast<int>(v);
  }

  int32_t quantified() {
    int32_t atom_node = atom();
    for (;;) {
      int min, max;
      if (eat('*')) {
        min = 0, max = -1;
      } else if (eat('+')) {
        min = 1, max = -1;
      } else if (eat('?')) {
        min = 0, max = 1;
      } else if (!at_end() && peek() == '{' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] >= '0' &&
                 cps_[pos_ + 1] <= '9') {
        ++pos_;
        min = count();
        max = min;
        if (eat(',')) max = (!at_end() && peek() == '}') ? -1 : count();
        if (!eat('}')) fail("expected '}'");
        if (max >= 0 && max < min) fail("{n,m} with m < n");
      } else {
        return atom_node;
      }
      if (eat('+')) fail("possessive quantifiers are not supported");
      eat('?');  // lazy: the same whole matches
      atom_node = g_.repeat(atom_node, min, max);
    }
  }

  int32_t atom() {
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (eat('?')) {
          if (eat(':')) {
          } else if (eat('P') && eat('<')) {
            skip_name();
          } else if (!at_end() && peek() == '<' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != '=' &&
                     cps_[pos_ + 1] != '!') {
            ++pos_;
            skip_name();
          } else {
            fail("lookaround, flags and other (? groups are not supported");
          }
        }
        ++depth_;
        const int32_t inner = alternation(nullptr);
        --depth_;
        if (!eat(')')) fail("missing ')'");
        return inner;
      }
      case '[': return make_chars(char_class());
      case '.': return make_chars(complement_ranges({{'\n', '\n'}}));
      case '\\': return escape_atom();
      case '*': case '+': case '?': fail("nothing to repeat");
      case '{': case '}': case ']':
      default: return make_chars({{c, c}});
    }
  }

  void skip_name() {
    while (!at_end() && peek() != '>') ++pos_;
    if (!eat('>')) fail("unterminated group name");
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end()) fail("truncated escape");
      const uint32_t d = peek();
      int x = d >= '0' && d <= '9' ? int(d - '0') : d >= 'a' && d <= 'f' ? int(d - 'a' + 10) : d >= 'A' && d <= 'F' ? int(d - 'A' + 10) : -1;
      if (x < 0) fail("bad hex digit in escape");
      v = v * 16 + static_cast<uint32_t>(x);
      ++pos_;
    }
    return v;
  }

  // One escape after '\': a class (\d ...) or a single code point.
  CodePointRanges escape_set(bool in_class) {
    if (at_end()) fail("trailing backslash");
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement_ranges(kDigit);
      case 'w': return kWord;
      case 'W': return complement_ranges(kWord);
      case 's': return kSpace;
      case 'S': return complement_ranges(kSpace);
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (eat('{')) {
          v = 0;
          int n = 0;
          while (!at_end() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 6 || v > kMaxCodePoint) fail("code point out of range");
          }
          if (!eat('}')) fail("unterminated \\u{");
        } else {
          v = hex(4);
        }
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        fail("word boundaries (\\b) are not supported");
      case 'B': case 'A': case 'z': case 'Z': case 'G': fail("anchors other than ^ and $ are not supported");
      case 'p': case 'P': fail("Unicode property classes (\\p) are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("unknown escape");
        return {{c, c}};
    }
  }

  int32_t escape_atom() { return make_chars(escape_set(false)); }

  CodePointRanges char_class() {
    const bool negate = eat('^');
    CodePointRanges ranges;
    bool first = true;
    for (;;) {
      if (at_end()) fail("unterminated character class");
      if (peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (peek() == '[' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] == ':') fail("POSIX classes are not supported");
      CodePointRanges lo_set = class_atom();
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && !at_end() && peek() == '-' &&
          pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        CodePointRanges hi_set = class_atom();
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second) fail("a class cannot bound a range");
        if (hi_set[0].first < lo_set[0].first) fail("range out of order");
        ranges.emplace_back(lo_set[0].first, hi_set[0].first);
      } else {
        ranges.insert(ranges.end(), lo_set.begin(), lo_set.end());
      }
    }
    ranges = normalize_ranges(std::move(ranges));
    return negate ? complement_ranges(ranges) : ranges;
  }

  CodePointRanges class_atom() {
    const uint32_t c = peek();
    ++pos_;
    if (c == '\\') return escape_set(true);
    return {{c, c}};
  }

  Grammar& g_;
  const RegexOptions& o_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

int32_t parse_regex(Grammar& g, std::string_view pattern, const RegexOptions& options) {
  if (pattern.size() > kMaxRegexLength) {
    throw GrammarError(options.what, fmt::format("{}: longer than {} bytes", options.what, kMaxRegexLength));
  }
  return RegexParser(g, pattern, options).parse();
}

}  // namespace m3::grammar
