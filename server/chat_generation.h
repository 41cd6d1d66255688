// What a chat-shaped request becomes before it reaches the engine, shared by
// /v1/chat/completions, /v1/messages and /v1/responses (the last two translate their bodies into a
// ChatRequest), so every route that speaks chat gets the same prompt, forcing and parsing:
// the tool choice checked against the server's parsers, the prompt rendered and tokenized, the
// output budget, the sampling parameters (with the forced call opener of tool_choice "required"
// or a named function) and the options of each choice's text pipeline (reasoning split, tool
// calls).
#pragma once
#include <string_view>

#include "engine/request.h"
#include "server/chat_prompt.h"
#include "server/choice_output.h"
#include "server/openai_request.h"
#include "server/server_context.h"

namespace m3::server {

// The request fields that errors name: the chat route's by default.
struct ChatFieldNames {
  std::string_view prompt = "messages";       // the conversation (a prompt that does not fit)
  std::string_view max_tokens = "max_tokens";  // the output budget
};

struct ChatGeneration {
  ChatPrompt prompt;
  int max_tokens = 0;
  SamplingParams sampling;
  ChoiceTextOptions text;  // per choice
  bool reasoning_split = false;  // a reasoning parser splits the output
};

// Throws ApiError 400 naming the field when the request cannot run on this server (a tool
// choice the server's options do not allow, a prompt the template refuses or that does not fit).
ChatGeneration prepare_chat_generation(const ServeOptions& options, const ModelContext& model,
                                       const ChatRequest& request,
                                       const ChatFieldNames& fields = {});

}  // namespace m3::server
