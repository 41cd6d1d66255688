// Regular expressions (the common ECMAScript / Python / RE2 subset that JSON Schema `pattern` and
// vLLM's `regex` use) into grammar nodes. Matching is whole-text: a leading ^ and a trailing $ are
// accepted and change nothing. Supported: literals and escapes (\n \t \r \f \v \0 \xHH \uHHHH
// \u{H..}), classes [...] with ranges and negation, \d \w \s and their negations, '.', groups
// ( ) (?: ) (?<name> ) (?P<name> ), alternation, * + ? {n} {n,} {n,m} (lazy forms allowed: the set
// of whole matches is the same). Anything else (backreferences, lookaround, \b, anchors inside,
// possessive quantifiers, flags) is a GrammarError naming `what` and the position.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace m3::grammar {

// How a set of code points becomes a node: plain UTF-8 by default; JSON string bodies escape.
using CharsBuilder = std::function<int32_t(Grammar&, const CodePointRanges&)>;

struct RegexOptions {
  std::string what = "regex";  // names the pattern in errors (e.g. "pattern", "regex")
  CharsBuilder chars;          // null: Grammar::chars
  bool search = false;         // JSON Schema pattern: matches anywhere unless anchored by ^ / $
};

inline constexpr int kMaxRegexRepeat = 1000;   // {n,m} bounds
inline constexpr size_t kMaxRegexLength = 4096;  // pattern bytes

int32_t parse_regex(Grammar& g, std::string_view pattern, const RegexOptions& options);

}  // namespace m3::grammar
