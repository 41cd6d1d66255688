#include "grammar/ebnf.h"

#include <map>

#include <fmt/format.h>

#include "grammar/grammar_error.h"
#include "grammar/regex.h"

namespace m3::grammar {
namespace {

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : t_(text) {}

  Grammar parse() {
    skip_space(true);
    while (pos_ < t_.size()) {
      const size_t line = line_;
      const std::string name = identifier();
      if (name.empty()) fail("expected a rule name");
      skip_space(true);
      if (t_.substr(pos_, 3) != "::=") fail("expected '::=' after the rule name");
      pos_ += 3;
      const int32_t rule = rule_id(name);
      if (defined_.count(name)) fail(fmt::format("rule '{}' is defined twice", name));
      defined_[name] = line;
      g_.set_body(rule, alternation());
      skip_space(true);
    }
    auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.count("root")) throw GrammarError("grammar", "grammar: no 'root' rule");
    for (const auto& [name, id] : ids_)
      if (!defined_.count(name)) throw GrammarError("grammar", fmt::format("grammar: rule '{}' is used but never defined", name));
    g_.set_start(root->second);
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(std::string_view why) const {
    throw GrammarError("grammar", fmt::format("grammar: {} (line {})", why, line_));
  }

  // Newlines end a rule only when the next line starts a new one; inside we skip them.
  void skip_space(bool newlines) {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (c == '\n') {
        if (!newlines) return;
        ++line_;
        ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else {
        return;
      }
    }
  }

  static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  }
  std::string identifier() {
    const size_t start = pos_;
    while (pos_ < t_.size() && ident_char(t_[pos_])) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  int32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int32_t id = g_.add_rule(name);
    ids_.emplace(name, id);
    return id;
  }

  // At a newline: does the next line begin a new rule ("name ::=")?
  bool next_line_starts_rule() const {
    size_t p = pos_;
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t' || t_[p] == '\r' || t_[p] == '\n')) ++p;
    size_t q = p;
    while (q < t_.size() && ident_char(t_[q])) ++q;
    if (q == p) return p >= t_.size();
    while (q < t_.size() && (t_[q] == ' ' || t_[q] == '\t')) ++q;
    return t_.substr(q, 3) == "::=";
  }

  void skip_inside() {
    for (;;) {
      skip_space(false);
      if (pos_ < t_.size() && t_[pos_] == '\n' && !next_line_starts_rule()) {
        ++pos_;
        ++line_;
        continue;
      }
      return;
    }
  }

  bool at_rule_end() {
    skip_inside();
    return pos_ >= t_.size() || t_[pos_] == '\n';
  }

  int32_t alternation() {
    std::vector<int32_t> options = {sequence()};
    while (!at_rule_end() && t_[pos_] == '|') {
      ++pos_;
      options.push_back(sequence());
    }
    return g_.alt(std::move(options));
  }

  int32_t sequence() {
    std::vector<int32_t> parts;
    while (!at_rule_end() && t_[pos_] != '|' && t_[pos_] != ')') parts.push_back(postfix());
    return g_.seq(std::move(parts));
  }

  int count() {
    skip_inside();
    int64_t v = 0;
    const size_t start = pos_;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > kMaxRegexRepeat) fail(fmt::format("repeat count above {}", kMaxRegexRepeat));
    }
    if (pos_ == start) fail("expected a number");
    skip_inside();
    return static_cast<int>(v);
  }

  int32_t postfix() {
    int32_t node = primary();
    for (;;) {
      if (pos_ >= t_.size()) return node;
      const char c = t_[pos_];
      if (c == '*') node = g_.star(node), ++pos_;
      else if (c == '+') node = g_.repeat(node, 1, -1), ++pos_;
      else if (c == '?') node = g_.optional(node), ++pos_;
      else if (c == '{') {
        ++pos_;
        const int min = count();
        int max = min;
        if (pos_ < t_.size() && t_[pos_] == ',') {
          ++pos_;
          skip_inside();
          max = (pos_ < t_.size() && t_[pos_] == '}') ? -1 : count();
        }
        if (pos_ >= t_.size() || t_[pos_] != '}') fail("expected '}'");
        ++pos_;
        if (max >= 0 && max < min) fail("{m,n} with n < m");
        node = g_.repeat(node, min, max);
      } else {
        return node;
      }
    }
  }

  int32_t primary() {
    skip_inside();
    if (pos_ >= t_.size()) fail("unexpected end");
    const char c = t_[pos_];
    if (c == '"' || c == '\'') return literal(c);
    if (c == '[') {
      const size_t start = pos_;
      ++pos_;
      while (pos_ < t_.size() && t_[pos_] != ']') {
        if (t_[pos_] == '\\') ++pos_;
        if (t_[pos_] == '\n') fail("unterminated character class");
        ++pos_;
      }
      if (pos_ >= t_.size()) fail("unterminated character class");
      ++pos_;
      RegexOptions o;
      o.what = fmt::format("grammar (line {})", line_);
      try {
        return parse_regex(g_, t_.substr(start, pos_ - start), o);
      } catch (const GrammarError& e) {
        throw GrammarError("grammar", e.what());
      }
    }
    if (c == '(') {
      ++pos_;
      const int32_t inner = alternation();
      skip_inside();
      if (pos_ >= t_.size() || t_[pos_] != ')') fail("missing ')'");
      ++pos_;
      return inner;
    }
    const std::string name = identifier();
    if (name.empty()) fail(fmt::format("unexpected character '{}'", c));
    return g_.ref(rule_id(name));
  }

  int32_t literal(char quote) {
    ++pos_;
    std::string bytes;
    while (pos_ < t_.size() && t_[pos_] != quote) {
      char c = t_[pos_++];
      if (c == '\n') fail("unterminated string literal");
      if (c != '\\') {
        bytes += c;
        continue;
      }
      if (pos_ >= t_.size()) fail("unterminated escape");
      const char e = t_[pos_++];
      auto hex = [&](int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          if (pos_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[pos_]))) fail("bad hex escape");
          const char h = t_[pos_++];
          v = v * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        return v;
      };
      uint32_t cp;
      switch (e) {
        case 'n': cp = '\n'; break;
        case 't': cp = '\t'; break;
        case 'r': cp = '\r'; break;
        case 'x': cp = hex(2); break;
        case 'u': cp = hex(4); break;
        case 'U': cp = hex(8); break;
        default: cp = static_cast<unsigned char>(e);
      }
      if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) fail("escape outside Unicode");
      std::vector<int32_t> one = {g_.chars({{cp, cp}})};
      if (!bytes.empty()) pending_.push_back(g_.byte_string(bytes));
      bytes.clear();
      pending_.push_back(one[0]);
    }
    if (pos_ >= t_.size()) fail("unterminated string literal");
    ++pos_;
    if (!bytes.empty()) pending_.push_back(g_.byte_string(bytes));
    std::vector<int32_t> parts;
    parts.swap(pending_);
    return g_.seq(std::move(parts));
  }

  std::string_view t_;
  size_t pos_ = 0;
  size_t line_ = 1;
  Grammar g_;
  std::map<std::string, int32_t> ids_;
  std::map<std::string, size_t> defined_;
  std::vector<int32_t> pending_;
};

}  // namespace

Grammar parse_ebnf(std::string_view text) {
  if (text.size() > kMaxGrammarLength)
    throw GrammarError("grammar", fmt::format("grammar: longer than {} bytes", kMaxGrammarLength));
  try {
    decode_utf8(text, "grammar");
  } catch (const GrammarError&) {
    throw GrammarError("grammar", "grammar: not valid UTF-8");
  }
  return EbnfParser(text).parse();
}

}  // namespace m3::grammar
