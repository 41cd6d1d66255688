// The Anthropic Messages request (POST /v1/messages and /v1/messages/count_tokens), parsed field
// by field and translated into the chat pipeline's request (server/openai_request.h ChatRequest),
// so prompt rendering, sampling, tool forcing and the text parsers are the chat route's own.
// A bad field is a 400 ApiError naming it (the route reports it in Anthropic's error shape).
//
// The translation:
//   system (string or text blocks)      -> a leading "system" message
//   user text blocks                    -> "user" messages (consecutive blocks joined by "\n")
//   user tool_result blocks             -> "tool" messages (tool_call_id = tool_use_id); content
//                                          as a string or text blocks; is_error prefixes the
//                                          content with "Error: " (the template has no error flag)
//   assistant text / thinking / tool_use-> one "assistant" message: content, reasoning_content
//                                          (thinking blocks, so the template writes them back as
//                                          reasoning), tool_calls (input as the arguments object)
//   a final assistant message           -> a prefill: the model continues it
//   tools [{name, description, input_schema}] -> function tools (parameters = input_schema)
//   tool_choice auto / any / tool / none-> auto / "required" / the named function / none; with
//                                          disable_parallel_tool_use the output keeps one call
//   thinking enabled / disabled / adaptive -> chat_template_kwargs.thinking_mode; budget_tokens
//                                          caps the reasoning (SamplingParams::reasoning_budget)
//   stop_sequences, max_tokens (required), temperature ([0, 1]), top_p, top_k, stream
//   metadata.user_id                    -> logged with the request
// Not accepted (400): images and documents (text-only models), server tools (web search, code
// execution, ...), mcp_servers, container. redacted_thinking blocks are dropped: they carry
// another provider's encrypted reasoning, which no template can render. The signature of a
// thinking block is not checked (m3serve signs nothing: its thinking blocks carry ""). Accepted
// without effect, because they ask for nothing m3serve would do differently: cache_control marks
// (the prefix cache reuses every shared prompt prefix without them) and the anthropic-version /
// anthropic-beta headers (the one shape served is the 2023-06-01 Messages API). Other unknown
// fields are ignored, as on the OpenAI routes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "server/openai_request.h"

namespace m3::server {

struct AnthropicRequest {
  ChatRequest chat;  // what the chat pipeline runs
  // thinking.type: "" (not given: the template's default), "enabled", "disabled", "adaptive".
  std::string thinking;
  std::optional<int64_t> thinking_budget;  // thinking.budget_tokens (enabled only)
  bool single_tool_call = false;           // tool_choice.disable_parallel_tool_use
  std::optional<std::string> user_id;      // metadata.user_id
};

// `count_tokens`: the body of /v1/messages/count_tokens, where max_tokens, stream and the
// sampling fields do not apply (max_tokens is then optional and unchecked).
AnthropicRequest parse_anthropic_request(const Json& body, const RequestLimits& limits,
                                         bool count_tokens = false);

}  // namespace m3::server
