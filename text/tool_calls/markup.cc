#include "text/tool_calls/markup.h"

#include <algorithm>
#include <array>

namespace m3::text::tool_calls {
namespace {

// Longest tag body (between '<' and '>') considered: an invoke name, an attribute or a
// parameter name longer than this is not markup. Bounds how long text is held back.
constexpr std::size_t kMaxTagBody = 320;
constexpr std::size_t kMaxElementName = 128;

constexpr std::string_view kM2BlockOpen = "<minimax:tool_call>";
constexpr std::string_view kM2BlockClose = "</minimax:tool_call>";
constexpr std::string_view kM2InvokeClose = "</invoke>";
constexpr std::string_view kM2ParamClose = "</parameter>";
constexpr std::string_view kM2InvokeHead = "<invoke";
constexpr std::string_view kM2ParamHead = "<parameter";

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_json_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_json_space(s.back())) s.remove_suffix(1);
  return s;
}

// `name="v"`, `name='v'` or `name=v` after the tag word, allowing whitespace around '='.
// Returns false when `attrs` is anything else.
bool parse_name_attribute(std::string_view attrs, std::string& name) {
  attrs = trim(attrs);
  if (!attrs.starts_with("name")) return false;
  attrs = trim(attrs.substr(4));
  if (attrs.empty() || attrs.front() != '=') return false;
  attrs = trim(attrs.substr(1));
  if (attrs.empty()) return false;
  std::string_view value;
  if (attrs.front() == '"' || attrs.front() == '\'') {
    const std::size_t end = attrs.find(attrs.front(), 1);
    if (end == std::string_view::npos || !trim(attrs.substr(end + 1)).empty()) return false;
    value = attrs.substr(1, end - 1);
  } else {
    value = attrs;
    if (std::any_of(value.begin(), value.end(), is_json_space)) return false;
  }
  value = trim(value);
  if (value.empty()) return false;
  name.assign(value);
  return true;
}

bool is_element_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxElementName) return false;
  if (name.front() == '/' || is_json_space(name.front()) || is_json_space(name.back())) return false;
  return name.find_first_of("<>\n\r") == std::string_view::npos;
}

// Scans for the '>' ending a tag whose '<' is at text[open]. Returns the index of '>', or npos
// with `incomplete` set when the text ends first, or npos alone when this is not a tag.
std::size_t find_tag_end(std::string_view text, std::size_t open, bool& incomplete) {
  incomplete = false;
  const std::size_t limit = std::min(text.size(), open + 1 + kMaxTagBody + 1);
  for (std::size_t i = open + 1; i < limit; ++i) {
    const char c = text[i];
    if (c == '>') return i;
    if (c == '<' || c == '\n' || c == '\r') return std::string_view::npos;
  }
  incomplete = limit == text.size() && text.size() < open + 1 + kMaxTagBody + 1;
  return std::string_view::npos;
}

Tag classify_m3_body(std::string_view body, std::size_t length) {
  Tag tag;
  tag.length = length;
  if (body == "tool_call") {
    tag.kind = TagKind::kBlockOpen;
  } else if (body == "/tool_call") {
    tag.kind = TagKind::kBlockClose;
  } else if (body == "/invoke") {
    tag.kind = TagKind::kInvokeClose;
  } else if (body.starts_with("invoke") && body.size() > 6 && is_json_space(body[6])) {
    tag.kind = parse_name_attribute(body.substr(6), tag.name) ? TagKind::kInvokeOpen : TagKind::kNone;
  } else if (body.starts_with('/')) {
    const std::string_view name = body.substr(1);
    if (is_element_name(name) && name != "invoke" && name != "tool_call") {
      tag.kind = TagKind::kElementClose;
      tag.name.assign(name);
    }
  } else if (is_element_name(body) && body != "invoke" && body != "tool_call") {
    tag.kind = TagKind::kElementOpen;
    tag.name.assign(body);
  }
  if (tag.kind == TagKind::kNone) tag.length = 0;
  return tag;
}

Tag lex_m3(std::string_view text, bool end_of_input) {
  const std::size_t ns = kM3Namespace.size();
  if (text.size() <= ns) {
    if (text.size() == ns && end_of_input) return {TagKind::kBareNamespace, ns, {}};
    return {end_of_input ? TagKind::kNone : TagKind::kIncomplete, 0, {}};  // not a marker: text
  }
  if (text[ns] != '<') return {TagKind::kBareNamespace, ns, {}};
  bool incomplete = false;
  const std::size_t close = find_tag_end(text, ns, incomplete);
  if (close == std::string_view::npos) {
    if (!incomplete) return {TagKind::kMarker, ns, {}};
    if (!end_of_input) return {TagKind::kIncomplete, 0, {}};
    return {TagKind::kUnreadable, text.size(), {}};  // a tag cut by the end of input
  }
  Tag tag = classify_m3_body(text.substr(ns + 1, close - ns - 1), close + 1);
  if (tag.kind == TagKind::kNone) tag = {TagKind::kUnreadable, close + 1, {}};
  return tag;
}

Tag lex_m2(std::string_view text, bool end_of_input) {
  static constexpr std::array<std::pair<std::string_view, TagKind>, 4> kFixed = {{
      {kM2BlockOpen, TagKind::kBlockOpen},
      {kM2BlockClose, TagKind::kBlockClose},
      {kM2InvokeClose, TagKind::kInvokeClose},
      {kM2ParamClose, TagKind::kElementClose},
  }};
  for (const auto& [literal, kind] : kFixed) {
    if (text.starts_with(literal)) return {kind, literal.size(), {}};
  }
  for (const auto& [head, kind] : {std::pair{kM2InvokeHead, TagKind::kInvokeOpen},
                                   std::pair{kM2ParamHead, TagKind::kElementOpen}}) {
    if (text.size() > head.size() && text.starts_with(head) && is_json_space(text[head.size()])) {
      bool incomplete = false;
      const std::size_t close = find_tag_end(text, 0, incomplete);
      if (close == std::string_view::npos) {
        return {incomplete && !end_of_input ? TagKind::kIncomplete : TagKind::kNone, 0, {}};
      }
      Tag tag{kind, close + 1, {}};
      if (!parse_name_attribute(text.substr(head.size(), close - head.size()), tag.name)) return {};
      return tag;
    }
  }
  if (!end_of_input) {
    // A proper prefix of a tag (for the attribute tags: up to the whitespace after the word).
    for (const auto& [literal, kind] : kFixed) {
      if (literal.starts_with(text)) return {TagKind::kIncomplete, 0, {}};
    }
    for (std::string_view head : {kM2InvokeHead, kM2ParamHead}) {
      if (head.starts_with(text)) return {TagKind::kIncomplete, 0, {}};
    }
  }
  return {};
}

}  // namespace

std::size_t find_tag_start(Dialect dialect, std::string_view text, std::size_t from) {
  if (from >= text.size()) return text.size();
  if (dialect == Dialect::kMiniMaxM2) {
    const std::size_t at = text.find('<', from);
    return at == std::string_view::npos ? text.size() : at;
  }
  const std::size_t at = text.find(kM3Namespace, from);
  if (at != std::string_view::npos) return at;
  // A marker split by the end of the text: the longest suffix that starts it.
  const std::size_t longest = std::min(kM3Namespace.size() - 1, text.size() - from);
  for (std::size_t n = longest; n > 0; --n) {
    if (kM3Namespace.starts_with(text.substr(text.size() - n))) return text.size() - n;
  }
  return text.size();
}

Tag lex_tag(Dialect dialect, std::string_view text, bool end_of_input) {
  return dialect == Dialect::kMiniMaxM3 ? lex_m3(text, end_of_input) : lex_m2(text, end_of_input);
}

std::size_t unaccepted_length(Dialect dialect, const Tag& tag, std::string_view text) {
  if (tag.length > 0) return tag.length;
  const std::size_t lead = dialect == Dialect::kMiniMaxM3 ? kM3Namespace.size() : 1;
  return std::min(lead, text.size());
}

Follow m2_closer_counts(std::string_view after, bool end_of_input) {
  std::size_t at = find_tag_start(Dialect::kMiniMaxM2, after, 0);
  while (at < after.size()) {
    const std::string_view rest = after.substr(at);
    const Tag next = lex_m2(rest, end_of_input);
    switch (next.kind) {
      case TagKind::kIncomplete: return Follow::kWait;
      case TagKind::kElementClose: return Follow::kNo;
      case TagKind::kElementOpen:
      case TagKind::kInvokeOpen:
      case TagKind::kInvokeClose:
      case TagKind::kBlockOpen:
      case TagKind::kBlockClose: return Follow::kYes;
      default: break;
    }
    at = find_tag_start(Dialect::kMiniMaxM2, after, at + unaccepted_length(Dialect::kMiniMaxM2, next, rest));
  }
  return end_of_input ? Follow::kYes : Follow::kWait;
}

}  // namespace m3::text::tool_calls
