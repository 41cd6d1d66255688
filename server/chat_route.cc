// POST /v1/chat/completions: messages -> chat template -> tokens -> n samples, each through the
// text pipeline (detokenize, stop strings, reasoning split, tool calls), streamed as
// chat.completion.chunk events or returned as one chat.completion.
//
// Reasoning is reported as `reasoning_content` (vLLM's long-standing field, also DeepSeek's) and
// as `reasoning` (vLLM's newer name), so clients of either generation find it.
//
// prompt_logprobs (a vLLM extension) go where vLLM puts them: a top-level `prompt_logprobs` list
// of the chat.completion, null for the first prompt token. vLLM refuses them with stream=true;
// m3serve streams them as completions does, on each choice's last chunk (top level).
#include <optional>

#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_generation.h"
#include "server/response_session.h"
#include "server/route_common.h"
#include "server/routes.h"
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
    nlohmann::json c = chunk(std::move(out));
    if (choice.ended) add_prompt_logprobs(c, choice);
    send_chunk(std::move(c), choice);
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
    body["usage"] = usage();
    if (!choices_.empty()) add_prompt_logprobs(body, *choices_.front());  // every choice has the same prompt
    if (request_.common.return_token_ids) body["prompt_token_ids"] = prompt_ids;
    return body;
  }

  void add_prompt_logprobs(nlohmann::json& body, const ChoiceState& choice) const {
    if (request_.common.prompt_logprobs < 0 || !choice.prompt_logprobs) return;
    body["prompt_logprobs"] = prompt_logprobs_json(*choice.prompt_logprobs, strings_);
  }

  ChatRequest request_;
};

}  // namespace

void handle_chat_completions(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  Json body = parse_json_body(req);
  ChatRequest request = parse_chat_request(body, context.options().request_limits);
  check_model_name(context, request.common.model);

  ChatGeneration g = prepare_chat_generation(context.options(), *model, request);

  auto s = std::make_shared<ChatSession>(context, model, std::move(request), arrival);
  const ChatRequest& r = s->request();
  s->reasoning = g.reasoning_split;
  for (int j = 0; j < r.common.n; ++j) {
    auto choice = std::make_unique<ChoiceState>(model->tokenizer, g.text);
    choice->prompt_tokens = static_cast<int>(g.prompt.token_ids.size());
    s->choices().push_back(std::move(choice));
  }
  s->prompt_ids = g.prompt.token_ids;
  s->job().submit(make_engine_requests(s->id(), g.prompt.token_ids, g.sampling, r.common.n, *model));
  M3_LOG_DEBUG("chat {}: {} prompt tokens, n={}, max_tokens={}", s->id(), g.prompt.token_ids.size(),
               r.common.n, g.max_tokens);
  s->respond(req, res);
}

}  // namespace m3::server
