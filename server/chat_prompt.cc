#include "server/chat_prompt.h"

#include "core/error.h"
#include "server/api_error.h"

namespace m3::server {

std::string response_format_instruction(const ChatRequest& request) {
  if (request.response_format == "json_object") {
    return "Respond with a single valid JSON object and nothing else.";
  }
  if (request.response_format == "json_schema") {
    return "Respond with a single valid JSON object that conforms to this JSON schema, and "
           "nothing else:\n" +
           request.response_schema.dump();
  }
  return {};
}

namespace {

// The hint joins the first system/developer message, or becomes one.
Json with_format_hint(Json messages, const std::string& hint) {
  if (hint.empty()) return messages;
  if (!messages.empty()) {
    Json& first = messages.front();
    const std::string role = first.value("role", "");
    if ((role == "system" || role == "developer") && first["content"].is_string()) {
      first["content"] = first["content"].get<std::string>() + "\n\n" + hint;
      return messages;
    }
  }
  messages.insert(messages.begin(), Json{{"role", "system"}, {"content", hint}});
  return messages;
}

}  // namespace

ChatPrompt build_chat_prompt(const ChatRequest& request, const ModelContext& model,
                             std::string_view field) {
  if (!model.chat_template) {
    bad_request(
        "this model has no chat template (no chat_template in tokenizer_config.json or "
        "chat_template.jinja); start the server with --chat-template or use /v1/completions");
  }
  text::ChatTemplateInput input;
  input.messages = with_format_hint(request.messages, response_format_instruction(request));
  if (request.tools.is_array() && !request.tools.empty()) input.tools = request.tools;
  input.add_generation_prompt = request.add_generation_prompt;
  input.kwargs = request.chat_template_kwargs;
  if (request.reasoning_effort && !input.kwargs.contains("reasoning_effort")) {
    input.kwargs["reasoning_effort"] = *request.reasoning_effort;
  }

  ChatPrompt prompt;
  try {
    prompt.text = model.chat_template->render(input);
  } catch (const m3::Error& e) {
    throw ApiError(400, fmt::format("the chat template cannot render these messages: {}", e.what()),
                   std::string(field));
  }
  if (request.continue_final_message) {
    // As transformers does: cut the prompt right after the final message's content, so the
    // model continues that message instead of closing it.
    const Json& last = request.messages.back();
    std::string content = last.contains("content") && last["content"].is_string()
                              ? last["content"].get<std::string>()
                              : std::string();
    size_t pos = content.empty() ? std::string::npos : prompt.text.rfind(content);
    if (pos == std::string::npos) {
      bad_field("continue_final_message",
                "the final message's content was not found in the "
                "rendered prompt, so it cannot be continued");
    }
    prompt.text.resize(pos + content.size());
  }
  prompt.token_ids = model.tokenizer.encode(prompt.text, request.add_special_tokens);
  return prompt;
}

}  // namespace m3::server
