// Pieces of Anthropic Messages responses: the content blocks of a message built from a choice's
// deltas (with the stream events that announce them), stop reasons, usage and SSE framing.
//
// The stream grammar (Anthropic's):
//   message_start ping (content_block_start content_block_delta* content_block_stop)*
//   message_delta message_stop        -- or an `error` event where the response failed
// with `event: <type>` before each `data:` line. Block kinds: thinking (thinking_delta), text
// (text_delta), tool_use (input_json_delta, whose partial_json pieces concatenate to the input
// object's JSON). No signature is emitted: thinking blocks carry "signature": "".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/choice_output.h"
#include "server/openai_response.h"

namespace m3::server {

// "event: <type>\ndata: <json>\n\n", the type being the event's "type" field.
std::string anthropic_sse(const nlohmann::json& event);

// stop_reason (end_turn, max_tokens, stop_sequence, tool_use) and stop_sequence (the matched
// stop string, else null) of an ended choice; finish reasons abort and error have none (the
// response reports an error instead).
struct AnthropicStop {
  std::string reason;
  nlohmann::json sequence = nullptr;
};
AnthropicStop anthropic_stop(const ChoiceEnd& end);

// {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"}.
// As Anthropic counts them, input_tokens leaves out the prompt tokens read from the prefix cache
// (cache_read_input_tokens); nothing is ever charged as a cache write, since the prefix cache
// keeps blocks as a side effect of running them (cache_creation_input_tokens is 0).
nlohmann::json anthropic_usage(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens);

// A tool_use id: "toolu_" and 24 random alphanumerics.
text::ToolCallIdGenerator anthropic_tool_use_ids();

// The content of one message, block by block, in output order. Thinking comes first; text and
// tool_use blocks follow as the model writes them. Text that arrives while a tool_use block is
// open (stray text inside a call) is held and becomes a text block after it, so a call's input
// always streams into its own open block.
class AnthropicContent {
 public:
  // Applies one step's delta; returns the stream events it makes (may be empty).
  std::string add(const ChoiceDelta& delta);
  // Ends the content (closes the open block); returns the events. Call once.
  std::string close();
  // The content array of the whole message, once closed.
  const nlohmann::json& blocks() const { return blocks_; }

 private:
  enum class Kind { kNone, kThinking, kText, kToolUse };
  std::string open(Kind kind, nlohmann::json block);
  std::string end_block();
  std::string append_text(const std::string& text);
  std::string block_delta(nlohmann::json delta) const;

  Kind kind_ = Kind::kNone;
  int call_index_ = -1;     // the open tool_use block's call
  std::string arguments_;   // the open tool_use block's input JSON so far
  std::string held_text_;   // text that came while a tool_use block was open
  nlohmann::json blocks_ = nlohmann::json::array();
};

}  // namespace m3::server
