// From a chat request to the prompt: messages (with a response_format hint), tools and
// chat_template_kwargs rendered through the model's chat template, then tokenized.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_request.h"
#include "server/server_context.h"

namespace m3::server {

struct ChatPrompt {
  std::string text;
  std::vector<int32_t> token_ids;
};

// Template errors (a conversation the template refuses, such as roles out of order) are 400s
// carrying the template's message and naming `field` (the request's conversation).
ChatPrompt build_chat_prompt(const ChatRequest& request, const ModelContext& model,
                             std::string_view field = "messages");

// The instruction m3serve adds for response_format json_object / json_schema: the format is
// enforced by constrained decoding (server/constraint_compiler.h); the instruction tells the
// model what it is writing, so that it writes it well.
std::string response_format_instruction(const ChatRequest& request);

}  // namespace m3::server
