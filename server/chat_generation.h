// What the chat-shaped routes (/v1/chat/completions, /v1/messages) prepare from a ChatRequest
// before they submit it: the tool choice checked against the server's parsers, the prompt
// rendered and tokenized, the output budget, the sampling parameters (with the forced opening of
// a tool call for tool_choice "required" or a named function) and the options of each choice's
// text pipeline (reasoning and tool-call parsers). One place, so every route that speaks chat
// gets the same prompt, forcing and parsing.
#pragma once
#include <string>

#include "engine/request.h"
#include "server/chat_prompt.h"
#include "server/choice_output.h"
#include "server/openai_request.h"
#include "server/server_context.h"

namespace m3::server {

struct ChatGeneration {
  ChatPrompt prompt;
  int max_tokens = 0;
  SamplingParams sampling;
  ChoiceTextOptions text;  // the reasoning parser runs iff text.reasoning_parser is set
};

// 400 (naming tool_choice) when the request's tool choice needs a parser or flag the server was
// not started with.
void check_tool_choice(const ServeOptions& options, const ChatRequest& request);

// check_tool_choice, then the prompt (400 naming `prompt_field` when it is empty, has ids outside
// the vocabulary or does not fit max_model_len with max_tokens), sampling and text options.
ChatGeneration prepare_chat_generation(const ServeOptions& options, const ChatRequest& request,
                                       const ModelContext& model, std::string_view prompt_field = "messages");

}  // namespace m3::server
