// Lexing the tags of MiniMax tool-call markup, one tag at a time, from text that may still be
// arriving. Internal to the tool-call parser (text/tool_parser.h holds the grammar).
//
// The lexer only says what the text at a candidate position is; which tags mean something in
// the parser's current state, and what is taken literally, is the parser's business.
// "Incomplete" means more input could change the answer; at the end of input it never is.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace m3::text::tool_calls {

enum class Dialect {
  kMiniMaxM3,  // ]<]minimax[>[<tool_call> ... <invoke name="f"> ... <param>v</param>
  kMiniMaxM2,  // <minimax:tool_call> ... <invoke name="f"> ... <parameter name="k">v</parameter>
};

// The namespace marker that prefixes every M3 structural tag (one special token in the model's
// vocabulary; detokenized text carries it literally).
inline constexpr std::string_view kM3Namespace = "]<]minimax[>[";

enum class TagKind {
  kIncomplete,     // the text so far is a proper prefix of some tag: wait for more
  kNone,           // not a tag: text (M3: only a proper prefix of the marker at the end of input)
  kMarker,         // M3: the marker, then '<' and no '>' on the line within the limit; the marker
                   // alone is markup, what follows it is text
  kUnreadable,     // M3: the marker and a tag the parser cannot read (`NS<invoke name=>`, `NS<>`),
                   // or one cut by the end of input; `length` covers it
  kBareNamespace,  // M3: the namespace marker followed by something other than '<'
  kBlockOpen,      // M3 <tool_call> / M2 <minimax:tool_call>
  kBlockClose,
  kInvokeOpen,     // <invoke name="...">, name in Tag::name
  kInvokeClose,
  kElementOpen,    // M3 <name> (name in Tag::name) / M2 <parameter name="...">
  kElementClose,   // M3 </name> / M2 </parameter> (empty name: closes the open parameter)
};

struct Tag {
  TagKind kind = TagKind::kNone;
  std::size_t length = 0;  // bytes of the tag, namespace marker included
  std::string name;
};

// Position of the first place at or after `from` where a tag may start (for M3, also where a
// split namespace marker may start at the end of `text`); text.size() when there is none.
std::size_t find_tag_start(Dialect dialect, std::string_view text, std::size_t from);

// Lexes the tag at the start of `text` (a position find_tag_start returned).
Tag lex_tag(Dialect dialect, std::string_view text, bool end_of_input);

// How many bytes at the start of `text` `tag` spans when it is not accepted where it stands:
// the whole tag when it is one, else the marker (M3) or the '<' (M2).
std::size_t unaccepted_length(Dialect dialect, const Tag& tag, std::string_view text);

enum class Follow { kYes, kNo, kWait };

// The M2 parameter-closer rule: a `</parameter>` closes its value unless another `</parameter>`
// comes before the next structural tag (<parameter name=, <invoke name=, </invoke>, a block tag)
// or the end of input. `after` is the text right after the closer. kWait: neither has come yet.
Follow m2_closer_counts(std::string_view after, bool end_of_input);

inline bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace m3::text::tool_calls
