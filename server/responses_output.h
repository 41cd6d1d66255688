// The output items of a /v1/responses response, built from one choice's text deltas (the chat
// pipeline's ChoiceDelta: reasoning, content, tool calls), and the stream events that build them
// step by step. Streaming and non-streaming responses both run this, so a stream's items are
// exactly the whole response's.
//
// Items, in the order the text arrives:
//   reasoning      {id "rs_...", summary [], content [{type reasoning_text, text}], status}
//   message        {id "msg_...", role assistant, content [{type output_text, text, annotations [],
//                  logprobs []}], status}
//   function_call  {id "fc_...", call_id (the tool parser's "call_..."), name, arguments, status}
// A message opens at its first non-whitespace text: whitespace alone between two other items
// (the newline after reasoning, before a call) is no message. Content that arrives while a
// function call is open waits until that call ends (the next call, or the end), so a call's
// argument deltas are never interleaved with another item. Calls past `max_tool_calls` (the
// request's parallel_tool_calls / max_tool_calls) are left out.
//
// Logprobs (include "message.output_text.logprobs"): add() takes the entries of the tokens that
// made its delta ({token, logprob, bytes, top_logprobs}, as chat's). They belong to the
// message's text when the delta carries content, and go with it (held with held text, dropped
// with it), into the output_text part's `logprobs` and its output_text.delta event; the tokens
// of reasoning or of a call have none there.
//
// Events (their sequence_number is the caller's): output_item.added, then per kind
// content_part.added / reasoning_text.delta... / reasoning_text.done / content_part.done,
// content_part.added / output_text.delta... / output_text.done / content_part.done, or
// function_call_arguments.delta... / function_call_arguments.done; then output_item.done.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/choice_output.h"
#include "server/json_fields.h"

namespace m3::server {

class ResponseOutputBuilder {
 public:
  using Events = std::vector<nlohmann::json>;
  explicit ResponseOutputBuilder(int max_tool_calls = -1) : max_tool_calls_(max_tool_calls) {}

  // One step's final text (and its tokens' logprob entries, or none); appends the events it
  // implies.
  void add(const ChoiceDelta& delta, Events& events, nlohmann::json logprobs = nlohmann::json::array());
  // The end of the output: closes what is open, as "incomplete" when the output was cut short
  // (max_output_tokens), else "completed".
  void finish(bool incomplete, Events& events);

  const nlohmann::json& items() const { return items_; }
  // The concatenated output_text parts of every message item (the SDK's output_text).
  std::string output_text() const;
  // The output as the assistant's chat message, for the next turn of a stored conversation.
  Json chat_message() const;

 private:
  enum class Kind { kNone, kReasoning, kMessage, kFunctionCall };
  void open(Kind kind, nlohmann::json item, Events& events);
  void close(const char* status, Events& events);
  void reasoning(const std::string& text, Events& events);
  void content(const std::string& text, nlohmann::json logprobs, Events& events);
  void call(const text::ToolCallDelta& call, Events& events);
  nlohmann::json& open_item() { return items_.back(); }
  int output_index() const { return static_cast<int>(items_.size()) - 1; }

  int max_tool_calls_;
  nlohmann::json items_ = nlohmann::json::array();
  Kind open_ = Kind::kNone;
  int open_call_ = -1;         // the tool-call index of the open function_call item
  std::string held_;           // content not yet in an item (whitespace, or while a call is open)
  nlohmann::json held_logprobs_ = nlohmann::json::array();  // held_'s tokens' entries
  bool finished_ = false;
};

}  // namespace m3::server
