// EBNF grammars in the GBNF notation that vLLM's `grammar` / `guided_grammar` take (xgrammar's):
//   root   ::= item ("," item)*        # comments run to the end of the line
//   item   ::= "literal" | [a-z0-9_]+ | other-rule | ( ... ) | x? | x* | x+ | x{m} | x{m,} | x{m,n}
// Literals take \n \t \r \\ \" \xHH \uHHHH escapes; classes are the regex syntax's. The start
// rule is `root`. Left recursion, undefined rules and malformed text are GrammarErrors naming
// "grammar" with the line.
#pragma once
#include <string_view>

#include "grammar/grammar.h"

namespace m3::grammar {

inline constexpr size_t kMaxGrammarLength = 64 * 1024;

Grammar parse_ebnf(std::string_view text);

}  // namespace m3::grammar
