// Tool-call parsers for MiniMax models: find the tool calls in the assistant's content (after
// reasoning extraction), stream them as OpenAI `tool_calls` deltas, and keep the rest as content.
// Parser names: "minimax_m3", "minimax_m2" (as vLLM's --tool-call-parser).
//
// Grammar (NS is the namespace marker `]<]minimax[>[`; ws is JSON whitespace):
//
//   minimax_m3                                   minimax_m2
//   block  = NS"<tool_call>" ... NS"</tool_call>"  "<minimax:tool_call>" ... "</minimax:tool_call>"
//   invoke = NS"<invoke name=" Q ">" body          "<invoke name=" Q ">" body
//            NS"</invoke>"                           "</invoke>"
//   param  = NS"<" K ">" value NS"</" K ">"        "<parameter name=" Q ">" value "</parameter>"
//          | NS value NS"</" K ">"   (elided)
//   value  = text | (ws | param)*  (M3: nested objects; arrays as <item> children)
//   Q is "v", 'v' or v; K is 1..128 bytes, no '<', '>', CR, LF, not starting with '/' or
//   whitespace, not "invoke" or "tool_call". A tag holds at most 320 bytes between '<' and '>'
//   and no CR, LF or '<'; anything longer is text (this bounds how much text is held back; M3
//   drops the marker before it).
//
// How text is read:
//  - Markup. M3: the namespace marker is a special token, so a marker and the tag it starts are
//    markup wherever they stand; they never reach a value, a key or the content. M2 tags are
//    plain XML that prose may contain: outside a block they are content; inside one, its
//    structural tags (<parameter name=..>, </parameter>, <invoke name=..>, </invoke>, the block
//    tags) are markup, except a `</parameter>` that a value keeps (below).
//  - Outside calls, everything is content, except a block opener and, for M3 only, an invoke
//    header, which opens an implicit block (M3 tags are unambiguous; M2's are not).
//  - A call is committed, and streamed, once its invoke header is complete: its first delta
//    carries index, id and name. From then on it is never withdrawn; its arguments JSON is closed
//    by NS"</invoke>", or implicitly by the next invoke header, a block opener or closer, or the
//    end of input (ToolCall::complete is false only in that last case).
//  - Inside an invoke body, whitespace is dropped, parameters are read, and any other text is
//    content (never dropped, and it does not end the call), trimmed of whitespace at its ends.
//  - The elided first-parameter tag: M3 checkpoints emit the first parameter without its opening
//    tag: `NS<invoke name="save_file">NS offerta.docx NS</filename>` (vLLM PR #51075). Detected
//    where a parameter may start (in the invoke body, or as the first thing of an element's
//    body): NS followed by anything but '<'. The value runs to the next closing tag, whose name
//    names the parameter. If an opening tag comes first, the text was not a parameter: content
//    in an invoke body, text of the parent inside an element (the marker dropped either way).
//  - Values are coerced with the tool's JSON schema (text/json_schema_coerce.h). A top-level
//    parameter whose schema allows only strings streams character by character as a JSON string.
//    Other values are emitted whole when they close.
//  - Arguments are compact JSON: `{"k":v,"k2":v2}`, keys in the order generated; the key is sent
//    as soon as the parameter's opening tag is read (for an elided tag, with its value).
//
// Malformed output (what unconstrained requests still get), one rule per shape:
//  - Closing tags. M3: a marked closing tag always closes (a value cannot hold markup; an
//    unmarked `</k>` is text). It closes the innermost open element of its name and all opened
//    inside it; a closer naming no open element (a mismatched closer) closes the innermost open
//    one, at the top level the parameter. M2: a `</parameter>` closes its value unless another
//    `</parameter>` comes before the next structural tag or the end of input, so a value may hold
//    `</parameter>` text (an XML file, vLLM #44060) and the value ends at its last closer.
//  - Stray text after a closing tag (`NS<city>Seattle NS</city>I need the city. NS<days>...`) is
//    stray text of the invoke body: content. It never joins the value.
//  - Unclosed values are closed by the next tag that cannot lie inside them: NS"</invoke>", an
//    invoke header, a block tag, and the next parameter's opening tag (M2 always; M3 when the open
//    parameter allows only strings, which have no elements; in other M3 values an opening tag
//    nests an element); else by the end of input (the call is then incomplete).
//  - Repeated names: a top-level parameter given again in the same call is read by the same rules
//    and dropped, value and tags; the first value stands (arguments already streamed are never
//    withdrawn, so the first is the one that can stand). Repeated names in a nested object fold
//    into an array (text/json_schema_coerce.h).
//  - Stray markup is dropped as if it were not there: closers with nothing open, parameter tags
//    outside an invoke, block closers outside a block, M3 markers inside a value that open nothing,
//    a marker followed by a tag the parser cannot read (`NS<invoke name=>`, `NS<>`: both dropped)
//    or by '<' and no tag (the marker dropped, the text kept), an M3 tag cut by the end of input
//    (an M2 one is text), and M3 tags nested past 64 elements deep.
//
// Streaming holds back only text that may still become a tag (a split marker or an unfinished
// tag), an M2 `</parameter>` and the text after it until the next tag decides it, whitespace
// inside a block until the next tag, and values that are not plain strings until they close.
// parse() is feed() + finish() on a fresh parser, so a stream, in any chunking, produces exactly
// what parse() returns. Deltas are cut only before ASCII characters or where the input
// was cut, so valid UTF-8 input chunks give valid UTF-8 deltas. The input must be the text with
// special tokens kept (the namespace marker is one).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3::text {

struct ToolCallDelta {
  int index = 0;                    // position of the call in the message, from 0
  std::optional<std::string> id;    // set on the first delta of a call only
  std::optional<std::string> name;  // set on the first delta of a call only
  std::string arguments_delta;      // concatenated over a call: its arguments JSON text
};

// What one feed() produced. The order of content and call deltas within one feed is not kept.
struct ToolStreamDelta {
  std::string content_delta;
  std::vector<ToolCallDelta> tool_call_deltas;  // at most one per call index, in index order
  bool empty() const { return content_delta.empty() && tool_call_deltas.empty(); }
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object text
  bool complete = true;   // false: the input ended inside the call (its JSON was closed for it)
};

struct ToolParseResult {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// Makes the `id` of each tool call. The default draws "call_" + 24 random alphanumerics.
using ToolCallIdGenerator = std::function<std::string()>;

class ToolCallParser {
 public:
  // `tools`: the request's OpenAI tools array (or null). Throws m3::Error for an unknown parser
  // name (listing the valid ones) or a malformed tools array.
  ToolCallParser(std::string_view parser_name, const nlohmann::json& tools, ToolCallIdGenerator make_id = {});
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  static std::vector<std::string> names();

  // Consumes the next piece of content text.
  ToolStreamDelta feed(std::string_view content_delta);
  // End of the stream: flushes held-back text and closes an unfinished call.
  ToolStreamDelta finish();
  // Whole-output parse. Only on a parser that has not been fed.
  ToolParseResult parse(std::string_view content);

  // Whether a tool call has started so far (finish_reason "tool_calls").
  bool saw_tool_call() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The default id generator: "call_" followed by 24 random characters from [A-Za-z0-9].
ToolCallIdGenerator random_tool_call_ids();

}  // namespace m3::text
