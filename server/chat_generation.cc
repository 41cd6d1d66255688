#include "server/chat_generation.h"

#include <cctype>
#include <optional>

#include "server/api_error.h"
#include "server/route_common.h"
#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::server {
namespace {

void check_tool_choice(const ServeOptions& options, const ChatRequest& r) {
  if (r.tool_choice == ToolChoice::kAuto &&
      (!options.enable_auto_tool_choice || options.tool_call_parser.empty())) {
    throw ApiError(400,
                   "\"auto\" tool choice requires --enable-auto-tool-choice and "
                   "--tool-call-parser to be set",
                   "tool_choice");
  }
  if ((r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) &&
      options.tool_call_parser.empty()) {
    throw ApiError(400, "this tool_choice needs the server to be started with --tool-call-parser",
                   "tool_choice");
  }
}

// Which parsers run for this request, per the server's options and the tool choice.
ChoiceTextOptions text_options(const ServeOptions& options, const ChatRequest& r,
                               const std::string& prompt_text) {
  ChoiceTextOptions o;
  o.skip_special_tokens = r.common.skip_special_tokens;
  o.stop = r.common.stop;
  o.include_stop_str_in_output = r.common.include_stop_str_in_output;
  if (!options.reasoning_parser.empty()) {
    o.reasoning_parser = options.reasoning_parser;
    if (auto mode = r.chat_template_kwargs.find("thinking_mode");
        mode != r.chat_template_kwargs.end() && mode->is_string()) {
      o.reasoning_options.thinking_mode = mode->get<std::string>();
    }
    o.reasoning_options.prompt_ends_in_reasoning =
        text::ReasoningParser::prompt_ends_in_reasoning(options.reasoning_parser, prompt_text);
  }
  if (r.tool_choice != ToolChoice::kNone) {
    o.tool_parser = options.tool_call_parser;
    o.tools = nlohmann::json(r.tools);
  }
  // Parsers match their markers as text; markers may be special tokens, which must then
  // survive detokenization (vLLM's MiniMax parsers turn skip_special_tokens off too).
  if (!o.reasoning_parser.empty() || !o.tool_parser.empty()) o.skip_special_tokens = false;
  return o;
}

// tool_choice "required" or a named function: the model is made to open a call, since nothing
// else would make it call one. The call opener (with the function's name when it is known) is
// forced once reasoning has ended, or from the first token when the prompt already closed it
// (thinking disabled). As in vLLM, a model that answers without ever closing its reasoning is
// not forced. With "required", the model names the function itself unless there is only one.
void force_tool_call(const ServeOptions& options, const ChatRequest& r,
                     const std::string& prompt_text, const text::Tokenizer& tokenizer,
                     SamplingParams& sampling) {
  if (r.tool_choice != ToolChoice::kRequired && r.tool_choice != ToolChoice::kNamed) return;
  std::optional<std::string_view> name;
  if (r.tool_choice == ToolChoice::kNamed) {
    name = r.tool_choice_name;
  } else if (r.tools.is_array() && r.tools.size() == 1) {
    name = r.tools[0]["function"]["name"].get_ref<const std::string&>();
  }
  const std::string opener = text::ToolCallParser::call_opener(options.tool_call_parser, name);
  sampling.forced_tokens = tokenizer.encode(opener, false);
  if (options.reasoning_parser.empty()) return;
  const std::string_view end = text::ReasoningParser::end_marker(options.reasoning_parser);
  std::string_view prompt = prompt_text;
  while (!prompt.empty() && std::isspace(static_cast<unsigned char>(prompt.back()))) {
    prompt.remove_suffix(1);
  }
  if (!prompt.ends_with(end)) sampling.forced_after = tokenizer.encode(end, false);
}

}  // namespace

ChatGeneration prepare_chat_generation(const ServeOptions& options, const ModelContext& model,
                                       const ChatRequest& request, const ChatFieldNames& fields) {
  check_tool_choice(options, request);
  ChatGeneration g;
  g.prompt = build_chat_prompt(request, model, fields.prompt);
  check_prompt_ids(g.prompt.token_ids, model.vocab_size, fields.prompt);
  g.max_tokens = resolve_max_tokens(request.common, model,
                                    static_cast<int>(g.prompt.token_ids.size()), fields.prompt,
                                    fields.max_tokens);
  g.sampling = make_sampling_params(request.common, model.defaults, g.max_tokens);
  force_tool_call(options, request, g.prompt.text, model.tokenizer, g.sampling);
  g.text = text_options(options, request, g.prompt.text);
  g.reasoning_split = !g.text.reasoning_parser.empty();
  return g;
}

}  // namespace m3::server
