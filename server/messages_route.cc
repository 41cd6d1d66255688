// POST /v1/messages (Anthropic Messages API) and POST /v1/messages/count_tokens: the Anthropic
// request is translated into a chat request (server/anthropic_request.h) and runs the chat
// pipeline (server/chat_generation.h: prompt, sampling, tool forcing, reasoning and tool-call
// parsers); the output is reported as Anthropic content blocks (server/anthropic_response.h),
// streamed as Anthropic's events or returned as one message. Errors on these routes are in
// Anthropic's shape (server/anthropic_error.h; registered in server/openai_server.cc).
#include <algorithm>
#include <optional>

#include "core/log.h"
#include "server/anthropic_error.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/api_error.h"
#include "server/chat_generation.h"
#include "server/response_session.h"
#include "server/route_common.h"
#include "server/routes.h"
#include "text/reasoning_parser.h"

namespace m3::server {
namespace {

class MessagesSession final : public ResponseSession {
 public:
  MessagesSession(ServerContext& context, std::shared_ptr<const ModelContext> model, AnthropicRequest request,
                  GenerationJob::Clock::time_point arrival)
      : ResponseSession(context, std::move(model), "msg_", "message", arrival), request_(std::move(request)) {}

  const AnthropicRequest& request() const { return request_; }

 private:
  const CommonRequest& common() const override { return request_.chat.common; }

  ChoiceState& choice() { return *choices_.front(); }

  // The message with its content so far (message_start: none yet) and the stop reason once known.
  nlohmann::json message(nlohmann::json content, const AnthropicStop& stop) {
    const ChoiceState& c = choice();
    return {{"id", id()},
            {"type", "message"},
            {"role", "assistant"},
            {"model", context_.model_name()},
            {"content", std::move(content)},
            {"stop_reason", stop.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(stop.reason)},
            {"stop_sequence", stop.sequence},
            {"usage", anthropic_usage(c.prompt_tokens, c.cached_tokens, c.completion_tokens)}};
  }

  // message_start waits for the first engine output, which says how much of the prompt the
  // prefix cache served (the headers are out already, so the client sees the response begin).
  void stream_event(const ChoiceEvent& event) override {
    std::optional<ChoiceDelta> delta = apply(event);
    if (!delta) return;
    std::string out;
    if (!started_) {
      started_ = true;
      out += anthropic_sse({{"type", "message_start"}, {"message", message(nlohmann::json::array(), {})}});
      out += anthropic_sse({{"type", "ping"}});
    }
    out += content_.add(*delta);
    if (!out.empty()) write(std::move(out));
  }

  void stream_end() override {
    if (!stream_error().empty()) {  // a failed choice: its error event is the stream's last
      write(error_bytes(500, stream_error()));
      return;
    }
    const ChoiceState& c = choice();
    const AnthropicStop stop = anthropic_stop(c.end);
    if (stop.reason.empty()) {
      write(error_bytes(503, "the request was aborted before it finished (the server is shutting down)"));
      return;
    }
    std::string out = content_.close();
    out += anthropic_sse({{"type", "message_delta"},
                          {"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                          {"usage", anthropic_usage(c.prompt_tokens, c.cached_tokens, c.completion_tokens)}});
    out += anthropic_sse({{"type", "message_stop"}});
    write(std::move(out));
  }

  void collect_event(const ChoiceEvent& event) override {
    if (std::optional<ChoiceDelta> delta = apply(event)) content_.add(*delta);
  }

  nlohmann::json whole_body() override {
    const AnthropicStop stop = anthropic_stop(choice().end);
    if (stop.reason.empty()) {
      return anthropic_error_json(503, "the request was aborted before it finished (the server is shutting down)");
    }
    content_.close();
    return message(content_.blocks(), stop);
  }

  std::string error_bytes(int status, const std::string& message) override {
    const nlohmann::json error = anthropic_error_json(status, message);
    return common().stream ? anthropic_sse(error) : dump_json(error);
  }

  AnthropicRequest request_;
  AnthropicContent content_;
  bool started_ = false;
};

// thinking.budget_tokens: the engine forces the reasoning closer when the budget is spent. The
// output must start inside reasoning for that (the template pre-fills the opener when thinking
// is enabled); a prefilled answer has no reasoning to cap.
void apply_thinking_budget(const ServeOptions& options, const AnthropicRequest& a, const text::Tokenizer& tokenizer,
                           ChatGeneration& g) {
  if (!a.thinking_budget) return;
  if (options.reasoning_parser.empty()) {
    throw ApiError(400,
                   "'thinking.budget_tokens' needs the server to be started with --reasoning-parser "
                   "(it caps the reasoning, which only a reasoning parser tells from the answer)",
                   "thinking.budget_tokens");
  }
  if (!g.text.reasoning_options.prompt_ends_in_reasoning.value_or(false)) return;
  g.sampling.reasoning_budget = static_cast<int>(std::min<int64_t>(*a.thinking_budget, g.max_tokens));
  g.sampling.reasoning_end = tokenizer.encode(text::ReasoningParser::end_marker(options.reasoning_parser), false);
}

void handle_messages(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  AnthropicRequest request = parse_anthropic_request(parse_json_body(req), context.options().request_limits);
  check_model_name(context, request.chat.common.model);
  ChatGeneration g = prepare_chat_generation(context.options(), *model, request.chat);
  apply_thinking_budget(context.options(), request, model->tokenizer, g);
  g.text.make_tool_call_id = anthropic_tool_use_ids();
  if (request.single_tool_call) g.text.max_tool_calls = 1;

  auto s = std::make_shared<MessagesSession>(context, model, std::move(request), arrival);
  auto choice = std::make_unique<ChoiceState>(model->tokenizer, g.text);
  choice->prompt_tokens = static_cast<int>(g.prompt.token_ids.size());
  s->choices().push_back(std::move(choice));
  s->job().submit(make_engine_requests(s->id(), g.prompt.token_ids, g.sampling, 1, *model));
  M3_LOG_DEBUG("messages {}: {} prompt tokens, max_tokens={}, thinking={}, user_id={}", s->id(),
               g.prompt.token_ids.size(), g.max_tokens, s->request().thinking.empty() ? "default" : s->request().thinking,
               s->request().user_id.value_or("-"));
  res.set_header("request-id", s->id());
  s->respond(req, res);
}

void handle_count_tokens(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto model = context.require_model();
  AnthropicRequest request =
      parse_anthropic_request(parse_json_body(req), context.options().request_limits, /*count_tokens=*/true);
  check_model_name(context, request.chat.common.model);
  ChatPrompt prompt = build_chat_prompt(request.chat, *model);
  send_json(res, dump_json({{"input_tokens", prompt.token_ids.size()}}));
}

}  // namespace

void register_messages_routes(HttpServer& http, ServerContext& context) {
  auto errors = [](int status, std::string_view message, std::string_view param) {
    return anthropic_error_body(status, message, param);
  };
  http.post("/v1/messages", [&context](const HttpRequest& req, HttpResponse& res) { handle_messages(context, req, res); },
            errors);
  http.post("/v1/messages/count_tokens",
            [&context](const HttpRequest& req, HttpResponse& res) { handle_count_tokens(context, req, res); }, errors);
}

}  // namespace m3::server
