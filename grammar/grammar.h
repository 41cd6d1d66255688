// A grammar as the front ends (regex, EBNF, JSON Schema, choices, tool calls) build it: rules whose
// bodies are expressions over Unicode code-point sets, sequences, alternatives, bounded or
// unbounded repeats and references to rules. Everything is lowered to bytes (UTF-8) by the NFA
// compiler (grammar/nfa.h); a grammar without rule references is regular and ends up a DFA.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::grammar {

// Inclusive code-point ranges, sorted and disjoint. Surrogates (U+D800-DFFF) never match.
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

CodePointRanges normalize_ranges(CodePointRanges ranges);
CodePointRanges complement_ranges(const CodePointRanges& ranges);

struct Node {
  enum class Kind : uint8_t { kEmpty, kChars, kSeq, kAlt, kRepeat, kRef };
  Kind kind = Kind::kEmpty;
  std::vector<int32_t> kids;  // kSeq, kAlt: parts; kRepeat: the one repeated node
  CodePointRanges chars;      // kChars
  int32_t min = 0, max = 0;   // kRepeat: max < 0 is unbounded
  int32_t rule = -1;          // kRef
};

struct Rule {
  std::string name;
  int32_t body = -1;
};

class Grammar {
 public:
  // Nodes are built bottom-up and referred to by index.
  int32_t empty();
  int32_t chars(CodePointRanges ranges);
  int32_t byte_string(std::string_view utf8);  // the exact bytes, which must be valid UTF-8
  int32_t seq(std::vector<int32_t> parts);
  int32_t alt(std::vector<int32_t> options);
  int32_t repeat(int32_t node, int32_t min, int32_t max);  // max < 0: unbounded
  int32_t optional(int32_t node) { return repeat(node, 0, 1); }
  int32_t star(int32_t node) { return repeat(node, 0, -1); }
  int32_t ref(int32_t rule);

  // A rule without a body yet (for recursion); set_body gives it one.
  int32_t add_rule(std::string name);
  void set_body(int32_t rule, int32_t body);
  void set_start(int32_t rule) { start_ = rule; }

  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<Rule>& rules() const { return rules_; }
  int32_t start() const { return start_; }
  size_t num_nodes() const { return nodes_.size(); }

 private:
  int32_t push(Node n);
  std::vector<Node> nodes_;
  std::vector<Rule> rules_;
  int32_t start_ = -1;
};

// Appends the code points of valid UTF-8 `text` (throws GrammarError naming `what` otherwise).
std::vector<uint32_t> decode_utf8(std::string_view text, const std::string& what);

}  // namespace m3::grammar
