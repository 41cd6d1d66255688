// POST /v1/responses bodies (the OpenAI Responses API), parsed field by field and translated into
// the ChatRequest that the chat pipeline runs (server/chat_generation): input items become chat
// messages, flat function tools become chat tools, tool_choice / text.format / reasoning map onto
// their chat equivalents (so whatever the chat route does with them, constrained decoding
// included, applies here too).
//
// Unlike the chat route, every top-level field must be known: a field m3serve does not implement
// is a 400 naming it, so a client never gets an answer that silently ignored what it asked for.
// Hosted tools (web_search, file_search, code_interpreter, computer use, ...) are 400s naming the
// tool type. Fields accepted without effect, and why (docs/architecture.md "Responses API"):
// `include` "reasoning.encrypted_content" (reasoning is returned as plain reasoning_text, which
// clients send back as they would encrypted content), `reasoning.summary` (no summary is
// generated: the reasoning itself is the item's content), `prompt_cache_key` /
// `prompt_cache_retention` "in_memory" (prefix caching is automatic), `safety_identifier`,
// `user`, `service_tier` (reported as "default"), `stream_options.include_obfuscation` (no
// obfuscation padding is sent), `text.verbosity`, `truncation` "disabled", `background` false,
// and the labels `id`, `status`, `phase` of input items.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/json_fields.h"
#include "server/openai_request.h"

namespace m3::server {

struct ResponsesRequest {
  // What the chat pipeline runs. Its messages are left empty by the parser: the route composes
  // them (compose_messages) once the previous response's conversation is known.
  ChatRequest chat;
  Json input;  // the body's `input`: a string or an array of items
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;
  bool store = true;
  // Runs without the client: the POST answers at once with the queued response, GET reads it
  // back, POST .../cancel ends it. Needs store; not with stream.
  bool background = false;
  bool parallel_tool_calls = true;
  std::optional<int64_t> max_tool_calls;
  std::optional<int64_t> max_output_tokens;
  // Echoed in the response object.
  nlohmann::json tools = nlohmann::json::array();  // as sent (flat function tools)
  nlohmann::json tool_choice = "auto";             // as sent, or "auto" / "none" by default
  nlohmann::json text_format = {{"type", "text"}};
  nlohmann::json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  nlohmann::json metadata = nlohmann::json::object();
  std::optional<std::string> user;
  // include "message.output_text.logprobs": each output_text part carries its tokens' logprobs,
  // with top_logprobs alternatives each (0 by default); the chat pipeline then scores
  // chat.common.logprobs = top_logprobs.
  bool output_logprobs = false;
  int top_logprobs = 0;

  // Function calls reported per response: parallel_tool_calls false is 1, max_tool_calls caps
  // it; -1: no limit.
  int tool_call_limit() const;
};

// `limits`: the server's (the largest top_logprobs).
ResponsesRequest parse_responses_request(const Json& body, const RequestLimits& limits = {});

// `input` (a string, or message / function_call / function_call_output / reasoning items) as
// chat messages in the shape parse_chat_request gives them (content strings, tool-call arguments
// as objects, reasoning as reasoning_content), continuing `history` (chat messages, the
// conversation of previous_response_id, or empty): a function_call_output must answer a call of
// the history or of the input. Errors name the item ("input[2].call_id").
Json input_messages(const Json& input, const Json& history);

// `input` as Responses items, as GET /v1/responses/{id}/input_items lists them: a string is one
// user message; message contents given as strings become one text part; every item has an id
// (the client's, else a new "msg_" / "fc_" / "fco_" / "rs_" one).
nlohmann::json input_items_with_ids(const Json& input);

// The messages the template renders: the instructions as a system message (as vLLM does; they
// are not inherited from a previous response), then `conversation`.
Json compose_messages(const std::optional<std::string>& instructions, const Json& conversation);

}  // namespace m3::server
