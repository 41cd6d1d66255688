#include "server/chat_generation.h"

#include <cctype>
#include <optional>

#include "server/api_error.h"
#include "server/constraint_compiler.h"
#include "server/route_common.h"
#include "text/reasoning_parser.h"

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

// The text the constraint waits for before it starts: the end of reasoning, unless the prompt
// already closed it (thinking disabled). As in vLLM, output whose reasoning never ends is not
// constrained.
std::string constraint_start(const ServeOptions& options, const std::string& prompt_text) {
  if (options.reasoning_parser.empty()) return {};
  const std::string_view end = text::ReasoningParser::end_marker(options.reasoning_parser);
  std::string_view prompt = prompt_text;
  while (!prompt.empty() && std::isspace(static_cast<unsigned char>(prompt.back()))) prompt.remove_suffix(1);
  return prompt.ends_with(end) ? std::string() : std::string(end);
}

// tool_choice "required" / a named function (the output is tool calls to the declared functions,
// arguments valid against their schemas: a grammar of the parser's markup, minimax_m3 or
// minimax_m2), or the request's response_format / structured outputs.
void constrain_output(const ServeOptions& options, const ChatRequest& r, const std::string& prompt_text,
                      const ModelContext& model, const ChoiceTextOptions& text, SamplingParams& sampling) {
  ConstraintCompiler::Target target;
  target.tokenizer = &model.tokenizer;
  target.vocab_size = model.vocab_size;
  target.eos_token_ids = model.eos_token_ids;
  target.special_tokens_visible = !text.skip_special_tokens;
  target.start_after = constraint_start(options, prompt_text);
  const bool tool_call = r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed;
  if (!tool_call) {
    if (r.common.structured) sampling.constraint = model.constraints->for_spec(*r.common.structured, target);
    return;
  }
  sampling.constraint = model.constraints->for_tool_calls(
      options.tool_call_parser, r.tools, r.tool_choice == ToolChoice::kNamed ? r.tool_choice_name : std::string(),
      r.parallel_tool_calls && r.tool_choice == ToolChoice::kRequired, target);
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
  g.sampling = make_sampling_params(request.common, model.defaults, g.max_tokens, model.vocab_size);
  g.text = text_options(options, request, g.prompt.text);
  constrain_output(options, request, g.prompt.text, model, g.text, g.sampling);
  g.reasoning_split = !g.text.reasoning_parser.empty();
  return g;
}

}  // namespace m3::server
