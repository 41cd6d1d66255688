// POST /v1/chat/completions: messages -> chat template -> tokens -> n samples, each through the
// text pipeline (detokenize, stop strings, reasoning split, tool calls), streamed as
// chat.completion.chunk events or returned as one chat.completion.
//
// Reasoning is reported as `reasoning_content` (vLLM's long-standing field, also DeepSeek's) and
// as `reasoning` (vLLM's newer name), so clients of either generation find it.
#include <cctype>
#include <optional>

#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/response_session.h"
#include "server/route_common.h"
#include "server/routes.h"
#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::server {
namespace {

nlohmann::json tool_call_delta_json(const text::ToolCallDelta& call) {
  nlohmann::json out = {{"index", call.index}};
  nlohmann::json function = {{"arguments", call.arguments_delta}};
  if (call.id) {
    out["id"] = *call.id;
    out["type"] = "function";
  }
  if (call.name) function["name"] = *call.name;
  out["function"] = std::move(function);
  return out;
}

nlohmann::json delta_json(const ChoiceDelta& delta) {
  nlohmann::json out = nlohmann::json::object();
  if (!delta.reasoning.empty()) {
    out["reasoning_content"] = delta.reasoning;
    out["reasoning"] = delta.reasoning;
  }
  if (!delta.content.empty()) out["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& call : delta.tool_calls) calls.push_back(tool_call_delta_json(call));
    out["tool_calls"] = std::move(calls);
  }
  return out;
}

nlohmann::json message_json(bool reasoning_split, const ChoiceState& choice) {
  const ChoiceOutput& out = choice.text;
  nlohmann::json message = {{"role", "assistant"}};
  const bool has_calls = !out.tool_calls().empty();
  // As vLLM: no content is null when something else (tool calls, reasoning) was produced.
  const bool content_null = out.content().empty() && (has_calls || !out.reasoning().empty());
  message["content"] = content_null ? nlohmann::json(nullptr) : nlohmann::json(out.content());
  if (reasoning_split) {
    nlohmann::json reasoning =
        out.reasoning().empty() ? nlohmann::json(nullptr) : nlohmann::json(out.reasoning());
    message["reasoning_content"] = reasoning;
    message["reasoning"] = reasoning;
  }
  if (has_calls) {
    nlohmann::json calls = nlohmann::json::array();
    for (const AssembledToolCall& call : out.tool_calls()) {
      calls.push_back({{"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

class ChatSession final : public ResponseSession {
 public:
  ChatSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
              ChatRequest request, GenerationJob::Clock::time_point arrival)
      : ResponseSession(context, std::move(model), "chatcmpl-", "chat.completion.chunk", arrival),
        request_(std::move(request)) {}

  const ChatRequest& request() const { return request_; }
  std::vector<int32_t> prompt_ids;
  bool reasoning = false;  // a reasoning parser splits the output

 private:
  const CommonRequest& common() const override { return request_.common; }

  nlohmann::json logprobs_json(ChoiceState& choice) {
    if (request_.common.logprobs < 0) return nullptr;
    nlohmann::json content = chat_logprob_entries(choice.logprobs, strings_, request_.top_logprobs);
    choice.logprobs.clear();
    return {{"content", std::move(content)}};
  }

  // The first chunk of every choice announces the role, before any generation.
  void stream_start() override {
    for (int c = 0; c < static_cast<int>(choices_.size()); ++c) {
      nlohmann::json first = {{"index", c},
                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr},
                              {"finish_reason", nullptr}};
      send_chunk(chunk(std::move(first)), *choices_[c]);
    }
  }

  void stream_event(const ChoiceEvent& event) override {
    std::optional<ChoiceDelta> delta = apply(event);
    if (!delta) return;
    ChoiceState& choice = *choices_[event.choice];
    if (delta->empty() && choice.logprobs.empty() && !choice.ended) return;
    nlohmann::json out = {{"index", event.choice},
                          {"delta", delta_json(*delta)},
                          {"logprobs", logprobs_json(choice)},
                          {"finish_reason", choice.ended ? nlohmann::json(choice.end.finish_reason)
                                                         : nlohmann::json(nullptr)}};
    if (choice.ended) {
      out["stop_reason"] = choice.end.stop_reason;
      if (request_.common.return_token_ids) out["token_ids"] = choice.output_ids;
    }
    send_chunk(chunk(std::move(out)), choice);
  }

  void collect_event(const ChoiceEvent& event) override { apply(event); }

  nlohmann::json whole_body() override {
    nlohmann::json body = envelope();
    body["object"] = "chat.completion";
    body["choices"] = nlohmann::json::array();
    for (int c = 0; c < static_cast<int>(choices_.size()); ++c) {
      ChoiceState& choice = *choices_[c];
      nlohmann::json out = {{"index", c},
                            {"message", message_json(reasoning, choice)},
                            {"logprobs", logprobs_json(choice)},
                            {"finish_reason", choice.end.finish_reason},
                            {"stop_reason", choice.end.stop_reason}};
      if (request_.common.return_token_ids) out["token_ids"] = choice.output_ids;
      body["choices"].push_back(std::move(out));
    }
    body["usage"] = total_usage(choices_);
    if (request_.common.return_token_ids) body["prompt_token_ids"] = prompt_ids;
    return body;
  }

  ChatRequest request_;
};

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
// arguments valid against their schemas: a grammar of the minimax_m3 markup), or the request's
// response_format / structured outputs. With the minimax_m2 parser a required or named choice
// only forces the call's opening text (no grammar for its markup yet).
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
  if (options.tool_call_parser == "minimax_m3") {
    sampling.constraint = model.constraints->for_tool_calls(
        r.tools, r.tool_choice == ToolChoice::kNamed ? r.tool_choice_name : std::string(),
        r.parallel_tool_calls && r.tool_choice == ToolChoice::kRequired, target);
    return;
  }
  std::optional<std::string_view> name;
  if (r.tool_choice == ToolChoice::kNamed) {
    name = r.tool_choice_name;
  } else if (r.tools.is_array() && r.tools.size() == 1) {
    name = r.tools[0]["function"]["name"].get_ref<const std::string&>();
  }
  const std::string opener = text::ToolCallParser::call_opener(options.tool_call_parser, name);
  sampling.forced_tokens = model.tokenizer.encode(opener, false);
  if (!target.start_after.empty()) sampling.forced_after = model.tokenizer.encode(target.start_after, false);
}

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

}  // namespace

void handle_chat_completions(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  Json body = parse_json_body(req);
  ChatRequest request = parse_chat_request(body, context.options().request_limits);
  check_model_name(context, request.common.model);
  check_tool_choice(context.options(), request);

  ChatPrompt prompt = build_chat_prompt(request, *model);
  check_prompt_ids(prompt.token_ids, model->vocab_size, "messages");
  int max_tokens = resolve_max_tokens(request.common, *model,
                                      static_cast<int>(prompt.token_ids.size()), "messages");
  SamplingParams sampling = make_sampling_params(request.common, model->defaults, max_tokens);
  ChoiceTextOptions options = text_options(context.options(), request, prompt.text);
  constrain_output(context.options(), request, prompt.text, *model, options, sampling);

  auto s = std::make_shared<ChatSession>(context, model, std::move(request), arrival);
  const ChatRequest& r = s->request();
  s->reasoning = !options.reasoning_parser.empty();
  for (int j = 0; j < r.common.n; ++j) {
    auto choice = std::make_unique<ChoiceState>(model->tokenizer, options);
    choice->prompt_tokens = static_cast<int>(prompt.token_ids.size());
    s->choices().push_back(std::move(choice));
  }
  s->prompt_ids = prompt.token_ids;
  s->job().submit(make_engine_requests(s->id(), prompt.token_ids, sampling, r.common.n, *model));
  M3_LOG_DEBUG("chat {}: {} prompt tokens, n={}, max_tokens={}", s->id(), prompt.token_ids.size(),
               r.common.n, max_tokens);
  s->respond(req, res);
}

}  // namespace m3::server
