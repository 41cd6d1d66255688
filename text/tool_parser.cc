#include "text/tool_parser.h"

#include <random>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/json_schema_coerce.h"
#include "text/tool_calls/markup.h"

namespace m3::text {
namespace {

using tool_calls::Dialect;
using tool_calls::Follow;
using tool_calls::Tag;
using tool_calls::TagKind;
using tool_calls::is_json_space;

constexpr std::pair<std::string_view, Dialect> kParsers[] = {
    {"minimax_m3", Dialect::kMiniMaxM3},
    {"minimax_m2", Dialect::kMiniMaxM2},
};

Dialect dialect_by_name(std::string_view name) {
  std::string valid;
  for (const auto& [parser, dialect] : kParsers) {
    if (parser == name) return dialect;
    valid += valid.empty() ? "" : ", ";
    valid += parser;
  }
  m3::fail("unknown tool-call parser '{}'; valid: {}", name, valid);
}

enum class Mode {
  kText,          // outside calls (in or out of a block)
  kBody,          // in an invoke body, between parameters
  kStringValue,   // in a top-level string parameter, streamed as it arrives
  kElementValue,  // in any other top-level parameter, collected until it closes
};

// Elements nested deeper than this inside a parameter are taken as literal text.
constexpr std::size_t kMaxElementDepth = 64;

// How a tag met inside a top-level value affects that value.
enum class ValueEnd {
  kNo,          // the tag is not the value's end (text or dropped markup, or a nested element)
  kWait,        // more input decides
  kConsumeTag,  // the tag closes the value
  kKeepTag,     // the value ends before the tag (it was left unclosed), which the body reads next
};

// An element of the open top-level parameter while its text arrives (the parameter itself is
// the bottom of the stack).
struct OpenElement {
  std::string name;            // empty while elided: the closing tag will name it
  bool elided = false;
  std::size_t raw_begin = 0;   // where its text starts in State::param_raw
  std::vector<MarkupElement> children;
  bool has_text = false;
  bool at_boundary = true;     // only whitespace since its opening tag or its last child
};

bool has_non_space(std::string_view s) {
  for (char c : s) {
    if (!is_json_space(c)) return true;
  }
  return false;
}

}  // namespace

struct ToolCallParser::State {
  Dialect dialect;
  ToolSchemas schemas;
  ToolCallIdGenerator make_id;

  std::string buffer;   // received and not yet consumed, from `pos`
  std::size_t pos = 0;
  bool fed = false;
  bool finished = false;

  Mode mode = Mode::kText;
  bool in_block = false;
  bool junk_started = false;  // inside a piece of stray text in a block or invoke body
  std::string held_space;     // whitespace between tags, until what follows decides it

  int call_count = 0;  // calls started; the open call is call_count - 1
  std::string call_name;
  std::set<std::string, std::less<>> call_keys;  // top-level keys sent for the open call
  std::vector<bool> call_complete;

  std::string param_name;
  SchemaNode param_schema;
  bool param_dropped = false;  // the open parameter repeats a key of the call: read, not sent
  std::string param_raw;       // text of the open kElementValue parameter, markup left out
  std::vector<OpenElement> stack;

  ToolStreamDelta out;  // what the current feed() returns

  std::string_view rest() const { return std::string_view(buffer).substr(pos); }

  // What a tag that is not accepted where it stands leaves: true when its bytes are text, false
  // when they are markup, dropped. M3: only a marker prefix cut by the end of input is text
  // (the marker is a special token: whatever it starts is markup). M2: a '<' that starts no tag
  // is text, and so is every tag outside a block (prose may hold XML); a structural tag inside
  // a block is markup.
  bool unaccepted_is_text(const Tag& tag) const {
    if (tag.kind == TagKind::kNone) return true;
    return dialect == Dialect::kMiniMaxM2 && !in_block;
  }

  // ---- output ----
  void emit_content(std::string_view s) { out.content_delta.append(s); }

  void emit_args(std::string_view s) {
    if (s.empty()) return;
    const int index = call_count - 1;
    if (out.tool_call_deltas.empty() || out.tool_call_deltas.back().index != index) {
      out.tool_call_deltas.push_back({index, std::nullopt, std::nullopt, {}});
    }
    out.tool_call_deltas.back().arguments_delta.append(s);
  }

  void emit_string_text(std::string_view raw) {
    if (param_dropped) return;
    std::string escaped;
    append_json_string_body(escaped, raw);
    emit_args(escaped);
  }

  // Sends `name` as the call's next key, or returns false when the call already has it.
  bool take_key(const std::string& name) {
    if (!call_keys.insert(name).second) return false;
    std::string text = call_keys.size() > 1 ? ",\"" : "{\"";
    append_json_string_body(text, name);
    text += "\":";
    emit_args(text);
    return true;
  }

  // ---- calls and parameters ----
  void open_call(const std::string& name) {
    ToolCallDelta delta;
    delta.index = call_count++;
    delta.id = make_id();
    delta.name = name;
    out.tool_call_deltas.push_back(std::move(delta));
    call_name = name;
    call_keys.clear();
    call_complete.push_back(true);
    mode = Mode::kBody;
  }

  void close_call(bool complete) {
    emit_args(call_keys.empty() ? "{}" : "}");
    call_complete.back() = complete;
    mode = Mode::kText;
  }

  void open_param(const std::string& name) {
    param_name = name;
    param_schema = schemas.parameter(call_name, name);
    param_dropped = !take_key(name);
    if (allows_only_strings(param_schema)) {
      if (!param_dropped) emit_args("\"");
      mode = Mode::kStringValue;
      return;
    }
    start_element_value(name, /*elided=*/false);
  }

  void close_string_value() {
    if (!param_dropped) emit_args("\"");
    param_dropped = false;
    mode = Mode::kBody;
    junk_started = false;
  }

  void start_element_value(const std::string& name, bool elided) {
    param_raw.clear();
    stack.clear();
    stack.push_back({name, elided, 0, {}, false, true});
    mode = Mode::kElementValue;
  }

  void finish_param(MarkupElement element, bool elided) {
    SchemaNode schema = param_schema;
    if (elided) {
      schema = schemas.parameter(call_name, element.name);
      param_dropped = !take_key(element.name);
    }
    if (!param_dropped) emit_args(to_json_text(coerce_element(schema, element)));
    param_dropped = false;
    mode = Mode::kBody;
    junk_started = false;
  }

  void append_value_text(std::string_view s) {
    param_raw.append(s);
    if (has_non_space(s)) {
      stack.back().has_text = true;
      stack.back().at_boundary = false;
    }
  }

  void close_top() {
    OpenElement e = std::move(stack.back());
    stack.pop_back();
    MarkupElement element{std::move(e.name), param_raw.substr(e.raw_begin), std::move(e.children), e.has_text};
    if (stack.empty()) return finish_param(std::move(element), e.elided);
    stack.back().children.push_back(std::move(element));
    stack.back().at_boundary = true;
  }

  // An elided element that met something other than a closing tag was not an element: its text
  // is text of the parent, or content when it is the parameter itself (its marker is dropped).
  void dissolve_top() {
    const bool had_text = stack.back().has_text;
    stack.pop_back();
    if (stack.empty()) {
      emit_content(param_raw);
      mode = Mode::kBody;
      junk_started = true;
      return;
    }
    if (had_text) {
      stack.back().has_text = true;
      stack.back().at_boundary = false;
    }
  }

  void close_all() {
    while (!stack.empty()) {
      if (stack.back().elided) {
        dissolve_top();
      } else {
        close_top();
      }
    }
  }

  // M3: the open element a closing tag closes: the innermost one of its name, else (a
  // mismatched closer) the innermost one. An elided element is named by the closer.
  int closing_target(const Tag& tag) const {
    for (int i = static_cast<int>(stack.size()) - 1; i >= 0; --i) {
      if (!stack[i].elided && stack[i].name == tag.name) return i;
    }
    return static_cast<int>(stack.size()) - 1;
  }

  void close_down_to(int target, const Tag& tag) {
    if (stack[target].elided) stack[target].name = tag.name;
    while (static_cast<int>(stack.size()) > target + 1) {
      if (stack.back().elided) {
        dissolve_top();
      } else {
        close_top();
      }
    }
    close_top();
  }

  // For a string value (M3 and M2) and any M2 value: whether `tag`, at `at`, ends it.
  ValueEnd value_end(const Tag& tag, std::string_view at, bool eof) const {
    switch (tag.kind) {
      case TagKind::kElementClose:
        if (dialect == Dialect::kMiniMaxM3) return ValueEnd::kConsumeTag;
        switch (tool_calls::m2_closer_counts(at.substr(tag.length), eof)) {
          case Follow::kWait: return ValueEnd::kWait;
          case Follow::kNo: return ValueEnd::kNo;
          case Follow::kYes: return ValueEnd::kConsumeTag;
        }
        return ValueEnd::kNo;
      case TagKind::kElementOpen:
      case TagKind::kInvokeOpen:
      case TagKind::kInvokeClose:
      case TagKind::kBlockOpen:
      case TagKind::kBlockClose: return ValueEnd::kKeepTag;
      default: return ValueEnd::kNo;
    }
  }

  // Bytes of a tag met in a value that is not its end: text of the value, or dropped markup.
  // M2 values keep a '<' that starts no tag and a `</parameter>` that did not close them.
  bool value_tag_is_text(const Tag& tag) const {
    return tag.kind == TagKind::kNone || dialect == Dialect::kMiniMaxM2;
  }

  // ---- steps: each consumes from the buffer or changes mode; false = needs more input ----
  bool step(bool eof) {
    if (pos >= buffer.size()) return false;
    switch (mode) {
      case Mode::kText: return in_block ? step_between_tags(eof) : step_outside(eof);
      case Mode::kBody: return step_between_tags(eof);
      case Mode::kStringValue: return step_string_value(eof);
      case Mode::kElementValue: return step_element_value(eof);
    }
    return false;
  }

  bool step_outside(bool eof) {
    const std::string_view r = rest();
    const std::size_t at = tool_calls::find_tag_start(dialect, r, 0);
    if (at > 0) {
      emit_content(r.substr(0, at));
      pos += at;
      return true;
    }
    const Tag tag = tool_calls::lex_tag(dialect, r, eof);
    if (tag.kind == TagKind::kIncomplete) return false;
    if (tag.kind == TagKind::kBlockOpen || (tag.kind == TagKind::kInvokeOpen && dialect == Dialect::kMiniMaxM3)) {
      pos += tag.length;
      in_block = true;
      junk_started = false;
      if (tag.kind == TagKind::kInvokeOpen) open_call(tag.name);
      return true;
    }
    const std::size_t n = tool_calls::unaccepted_length(dialect, tag, r);
    if (unaccepted_is_text(tag)) emit_content(r.substr(0, n));
    pos += n;
    return true;
  }

  // Applies a tag that means something between tags in the current mode; false if it does not.
  bool take_structural_tag(const Tag& tag) {
    if (mode == Mode::kText) {
      switch (tag.kind) {
        case TagKind::kBlockOpen: return true;  // a repeated opener changes nothing
        case TagKind::kBlockClose: in_block = false; return true;
        case TagKind::kInvokeOpen: open_call(tag.name); return true;
        default: return false;
      }
    }
    switch (tag.kind) {
      case TagKind::kInvokeClose: close_call(true); return true;
      case TagKind::kInvokeOpen: close_call(true); open_call(tag.name); return true;
      case TagKind::kBlockClose: close_call(true); in_block = false; return true;
      case TagKind::kBlockOpen: close_call(true); return true;
      case TagKind::kElementOpen: open_param(tag.name); return true;
      case TagKind::kBareNamespace: start_element_value({}, /*elided=*/true); return true;
      default: return false;
    }
  }

  // In a block or an invoke body: whitespace around tags is dropped, other text is content.
  // Whitespace waits in `held_space` until the next tag (dropped) or stray text (kept with it
  // unless it leads the stray text). Markup out of place is dropped as if it were not there.
  bool step_between_tags(bool eof) {
    const std::string_view r = rest();
    std::size_t spaces = 0;
    while (spaces < r.size() && is_json_space(r[spaces])) ++spaces;
    if (spaces > 0) {
      held_space.append(r.substr(0, spaces));
      pos += spaces;
      return true;
    }
    const std::size_t at = tool_calls::find_tag_start(dialect, r, 0);
    if (at > 0) {
      std::size_t end = at;
      while (is_json_space(r[end - 1])) --end;  // r[0] is not a space, so this stops at 1
      emit_junk(r.substr(0, end));
      pos += end;
      return true;
    }
    const Tag tag = tool_calls::lex_tag(dialect, r, eof);
    if (tag.kind == TagKind::kIncomplete) return false;
    if (take_structural_tag(tag)) {
      pos += tag.length;
      held_space.clear();
      junk_started = false;
      return true;
    }
    const std::size_t n = tool_calls::unaccepted_length(dialect, tag, r);
    if (unaccepted_is_text(tag)) emit_junk(r.substr(0, n));
    pos += n;
    return true;
  }

  void emit_junk(std::string_view text) {
    if (junk_started) emit_content(held_space);
    held_space.clear();
    emit_content(text);
    junk_started = true;
  }

  bool step_string_value(bool eof) {
    const std::string_view r = rest();
    const std::size_t at = tool_calls::find_tag_start(dialect, r, 0);
    if (at > 0) {
      emit_string_text(r.substr(0, at));
      pos += at;
      return true;
    }
    const Tag tag = tool_calls::lex_tag(dialect, r, eof);
    if (tag.kind == TagKind::kIncomplete) return false;
    switch (value_end(tag, r, eof)) {
      case ValueEnd::kWait: return false;
      case ValueEnd::kConsumeTag: pos += tag.length; [[fallthrough]];
      case ValueEnd::kKeepTag: close_string_value(); return true;
      case ValueEnd::kNo: break;
    }
    const std::size_t n = tool_calls::unaccepted_length(dialect, tag, r);
    if (value_tag_is_text(tag)) emit_string_text(r.substr(0, n));
    pos += n;
    return true;
  }

  bool step_element_value(bool eof) {
    const std::string_view r = rest();
    const std::size_t at = tool_calls::find_tag_start(dialect, r, 0);
    if (at > 0) {
      append_value_text(r.substr(0, at));
      pos += at;
      return true;
    }
    const Tag tag = tool_calls::lex_tag(dialect, r, eof);
    if (tag.kind == TagKind::kIncomplete) return false;
    if (dialect == Dialect::kMiniMaxM2) {
      switch (value_end(tag, r, eof)) {
        case ValueEnd::kWait: return false;
        case ValueEnd::kConsumeTag: pos += tag.length; close_all(); return true;
        case ValueEnd::kKeepTag: close_all(); return true;
        case ValueEnd::kNo: break;
      }
    } else if (step_m3_element_tag(tag)) {
      return true;
    }
    const std::size_t n = tool_calls::unaccepted_length(dialect, tag, r);
    if (value_tag_is_text(tag)) append_value_text(r.substr(0, n));
    pos += n;
    return true;
  }

  // A tag in an M3 value collected as elements; false when it is dropped markup or text.
  bool step_m3_element_tag(const Tag& tag) {
    switch (tag.kind) {
      case TagKind::kElementClose:
        close_down_to(closing_target(tag), tag);
        pos += tag.length;
        return true;
      case TagKind::kInvokeOpen:
      case TagKind::kInvokeClose:
      case TagKind::kBlockOpen:
      case TagKind::kBlockClose: close_all(); return true;
      case TagKind::kElementOpen:
        if (stack.back().elided) {
          dissolve_top();
          if (mode != Mode::kElementValue) return true;  // the body reads this tag as a parameter
        }
        // Past kMaxElementDepth an opening tag is dropped: the elements are walked recursively
        // (schema coercion, JSON), and the model's output must not be able to exhaust the stack.
        if (stack.size() >= kMaxElementDepth) return false;
        stack.push_back({tag.name, false, param_raw.size(), {}, false, true});
        pos += tag.length;
        return true;
      case TagKind::kBareNamespace:
        if (stack.back().elided || !stack.back().at_boundary || stack.size() >= kMaxElementDepth) return false;
        stack.push_back({{}, true, param_raw.size(), {}, false, true});
        pos += tag.length;
        return true;
      default: return false;
    }
  }

  // The input ended: close whatever is open.
  void finalize() {
    held_space.clear();  // whitespace at the end of the output, between tags
    if (mode == Mode::kStringValue) close_string_value();
    if (mode == Mode::kElementValue) close_all();
    if (mode == Mode::kBody) close_call(false);
  }

  ToolStreamDelta run(std::string_view text, bool eof) {
    M3_CHECK(!finished, "ToolCallParser: input after finish()");
    fed = true;
    buffer.append(text);
    while (step(eof)) {
    }
    buffer.erase(0, pos);
    pos = 0;
    if (eof) {
      M3_CHECK(buffer.empty(), "ToolCallParser: {} bytes left unread at the end of input", buffer.size());
      finalize();
      finished = true;
    }
    return std::exchange(out, {});
  }
};

ToolCallParser::ToolCallParser(std::string_view parser_name, const nlohmann::json& tools, ToolCallIdGenerator make_id)
    : state_(std::make_unique<State>()) {
  state_->dialect = dialect_by_name(parser_name);
  state_->schemas = ToolSchemas(tools);
  state_->make_id = make_id ? std::move(make_id) : random_tool_call_ids();
}

ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

std::vector<std::string> ToolCallParser::names() {
  std::vector<std::string> names;
  for (const auto& [name, dialect] : kParsers) names.emplace_back(name);
  return names;
}

ToolStreamDelta ToolCallParser::feed(std::string_view content_delta) { return state_->run(content_delta, false); }

ToolStreamDelta ToolCallParser::finish() { return state_->run({}, true); }

ToolParseResult ToolCallParser::parse(std::string_view content) {
  M3_CHECK(!state_->fed, "ToolCallParser::parse needs a parser that has not been fed");
  ToolParseResult result;
  for (ToolStreamDelta delta : {feed(content), finish()}) {
    result.content += delta.content_delta;
    for (ToolCallDelta& d : delta.tool_call_deltas) {
      if (d.id) result.tool_calls.push_back({*d.id, d.name.value_or(""), {}, true});
      result.tool_calls[d.index].arguments += d.arguments_delta;
    }
  }
  for (std::size_t i = 0; i < result.tool_calls.size(); ++i) {
    result.tool_calls[i].complete = state_->call_complete[i];
  }
  return result;
}

bool ToolCallParser::saw_tool_call() const { return state_->call_count > 0; }

ToolCallIdGenerator random_tool_call_ids() {
  auto engine = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [engine] {
    static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::uniform_int_distribution<std::size_t> pick(0, kAlphabet.size() - 1);
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlphabet[pick(*engine)];
    return id;
  };
}

}  // namespace m3::text
