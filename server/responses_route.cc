// The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, GET
// /v1/responses/{id}/input_items.
//
// A request is translated into a ChatRequest (server/responses_request) and runs the chat
// pipeline (server/chat_generation: template, sampling, forced tool calls, reasoning and tool
// parsers); its one choice's deltas become output items (server/responses_output), sent whole
// or as the Responses stream:
//   response.created, response.in_progress, the items' events, then response.completed,
//   response.incomplete (max_output_tokens; incomplete_details.reason) or response.failed,
// each as "event: <type>" + "data: <json>" with a sequence_number counting from 0, and no
// [DONE] (as OpenAI and vLLM). A response is stored (server/response_store) once it completed or
// is incomplete, unless `store` is false, so previous_response_id can continue it.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/log.h"
#include "server/api_error.h"
#include "server/background_tasks.h"
#include "server/chat_generation.h"
#include "server/http_server.h"
#include "server/response_session.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/responses_request.h"
#include "server/route_common.h"
#include "server/routes.h"

namespace m3::server {
namespace {

constexpr std::string_view kResponsesPath = "/v1/responses";

class ResponsesSession final : public ResponseSession {
 public:
  ResponsesSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
                   ResponsesRequest request, Json conversation, const SamplingParams& sampling,
                   GenerationJob::Clock::time_point arrival)
      : ResponseSession(context, std::move(model), "resp_", "response", arrival),
        request_(std::move(request)),
        conversation_(std::move(conversation)),
        temperature_(sampling.temperature),
        top_p_(sampling.top_p),
        output_(request_.tool_call_limit()) {}
  ~ResponsesSession() override {
    if (request_.background) context_.remove_background(id());
  }

  bool background() const { return request_.background; }
  // A background response before its first output, as the POST answers and GET first reads it.
  nlohmann::json queued_json() const { return response_json("queued"); }
  // Stores the queued response (its conversation is only continued once it has finished).
  void keep_queued() { keep(queued_json()); }

  // Background: on the tasks' thread. Ends the response as "cancelled" with what it produced so
  // far (stored), then closes its writer, which aborts the job as a client hang-up does.
  void cancel(DetachedWriter& writer) {
    if (final_stored_) return;
    ResponseOutputBuilder::Events unused;
    output_.finish(/*incomplete=*/true, unused);
    keep(response_json("cancelled"));
    writer.close();
  }

 private:
  const CommonRequest& common() const override { return request_.chat.common; }

  void stream_start() override {
    nlohmann::json snapshot = response_json("in_progress");
    send({{"type", "response.created"}, {"response", snapshot}});
    send({{"type", "response.in_progress"}, {"response", std::move(snapshot)}});
  }

  void stream_event(const ChoiceEvent& event) override {
    nlohmann::json logprobs;
    std::optional<ChoiceDelta> delta = track(event, logprobs);
    if (!delta) return;
    ResponseOutputBuilder::Events events;
    output_.add(*delta, events, std::move(logprobs));
    for (nlohmann::json& e : events) send(std::move(e));
  }

  void collect_event(const ChoiceEvent& event) override {
    if (request_.background && !progress_stored_) {  // GET now says it runs
      progress_stored_ = true;
      keep(response_json("in_progress"));
    }
    nlohmann::json logprobs;
    std::optional<ChoiceDelta> delta = track(event, logprobs);
    ResponseOutputBuilder::Events unused;  // the items are what a whole response needs
    if (delta) output_.add(*delta, unused, std::move(logprobs));
  }

  nlohmann::json whole_body() override {
    if (aborted()) {
      nlohmann::json failed = failed_json(std::string(kAborted));
      if (request_.background) keep(failed);  // a background response is only read back
      return failed;
    }
    ResponseOutputBuilder::Events unused;
    output_.finish(incomplete(), unused);
    nlohmann::json response = response_json(incomplete() ? "incomplete" : "completed");
    keep(response);
    return response;
  }

  void stream_end() override {
    if (!stream_error().empty() || aborted()) {
      // What was produced ends as incomplete items, so the stream keeps its grammar.
      ResponseOutputBuilder::Events events;
      output_.finish(/*incomplete=*/true, events);
      for (nlohmann::json& e : events) send(std::move(e));
      const std::string message = aborted() ? std::string(kAborted) : stream_error();
      send({{"type", "response.failed"}, {"response", failed_json(message)}});
      return;
    }
    ResponseOutputBuilder::Events events;
    output_.finish(incomplete(), events);
    for (nlohmann::json& e : events) send(std::move(e));
    nlohmann::json response = response_json(incomplete() ? "incomplete" : "completed");
    keep(response);
    send({{"type", incomplete() ? "response.incomplete" : "response.completed"},
          {"response", std::move(response)}});
  }

  // A failed choice (non-streaming: the body is the failed response) or an exception while the
  // response was produced (streaming: an error event). The Responses API reports these as a
  // failed response or a server_error event, whatever the HTTP status would have been.
  std::string error_bytes(int /*status*/, const std::string& message) override {
    if (!common().stream) {
      nlohmann::json failed = failed_json(message);
      if (request_.background) keep(failed);
      return dump_json(failed);
    }
    nlohmann::json event = {{"type", "error"}, {"code", "server_error"}, {"message", message},
                            {"param", nullptr}, {"sequence_number", sequence_++}};
    return "event: error\ndata: " + dump_json(event) + "\n\n";
  }

  // Applies an engine output; counts the tokens that carried reasoning (those that grew the
  // reasoning text or closed it). `logprobs`: with output logprobs asked for, the entries of the
  // tokens whose text this delta's content is (those since the last delta with text: a token
  // whose text is held back goes with the text that releases it), else an empty array; the
  // tokens of reasoning, of its end and of tool calls get none.
  std::optional<ChoiceDelta> track(const ChoiceEvent& event, nlohmann::json& logprobs) {
    ChoiceState& choice = *choices_[event.choice];
    const bool ended_before = choice.text.reasoning_ended();
    const size_t reasoning_before = choice.text.reasoning().size();
    std::optional<ChoiceDelta> delta = apply(event);
    const bool reasoning_step = choice.text.reasoning().size() > reasoning_before ||
                                (!ended_before && choice.text.reasoning_ended());
    if (delta && reasoning_step) reasoning_tokens_ += static_cast<int64_t>(event.output.new_token_ids.size());
    logprobs = nlohmann::json::array();
    if (!request_.output_logprobs) {
      choice.logprobs.clear();
    } else if (delta && !delta->content.empty()) {
      logprobs = chat_logprob_entries(choice.logprobs, strings_, request_.top_logprobs);
      choice.logprobs.clear();
    } else if (!delta || !delta->empty() || reasoning_step) {
      choice.logprobs.clear();  // reasoning or a call's tokens (or the choice has ended)
    }
    return delta;
  }

  // Output cut short by max_output_tokens (or the end of the context).
  bool incomplete() const { return choices_[0]->end.finish_reason == "length"; }
  // The engine aborted the request (the server is shutting down; a client that hung up gets
  // nothing more).
  bool aborted() const { return choices_[0]->end.finish_reason == "abort"; }
  static constexpr std::string_view kAborted =
      "the request was aborted before it finished (the server is shutting down)";

  void send(nlohmann::json event) {
    event["sequence_number"] = sequence_++;
    const std::string type = event["type"].get<std::string>();
    write("event: " + type + "\ndata: " + dump_json(event) + "\n\n");
  }

  nlohmann::json usage_json() const {
    const ChoiceState& choice = *choices_[0];
    return {{"input_tokens", choice.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", choice.cached_tokens}}},
            {"output_tokens", choice.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
            {"total_tokens", choice.prompt_tokens + choice.completion_tokens}};
  }

  nlohmann::json response_json(const std::string& status) const {
    const ResponsesRequest& r = request_;
    auto optional = [](const auto& value) {
      return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
    };
    nlohmann::json out = {
        {"id", id()},
        {"object", "response"},
        {"created_at", created()},
        {"status", status},
        {"background", r.background},
        {"error", nullptr},
        {"incomplete_details", nullptr},
        {"instructions", optional(r.instructions)},
        {"max_output_tokens", optional(r.max_output_tokens)},
        {"max_tool_calls", optional(r.max_tool_calls)},
        {"model", context_.model_name()},
        {"output", output_.items()},
        {"output_text", output_.output_text()},
        {"parallel_tool_calls", r.parallel_tool_calls},
        {"previous_response_id", optional(r.previous_response_id)},
        {"reasoning", r.reasoning},
        {"service_tier", "default"},
        {"store", r.store},
        {"temperature", temperature_},
        {"text", {{"format", r.text_format}}},
        {"tool_choice", r.tool_choice},
        {"tools", r.tools},
        {"top_logprobs", r.top_logprobs},
        {"top_p", top_p_},
        {"truncation", "disabled"},
        {"usage", status == "in_progress" ? nlohmann::json(nullptr) : usage_json()},
        {"user", optional(r.user)},
        {"metadata", r.metadata}};
    if (status == "incomplete") out["incomplete_details"] = {{"reason", "max_output_tokens"}};
    if (status == "completed" || status == "incomplete") out["completed_at"] = unix_time_seconds();
    return out;
  }

  // The failed response: its output so far, closed as incomplete.
  nlohmann::json failed_json(const std::string& message) {
    ResponseOutputBuilder::Events unused;
    output_.finish(/*incomplete=*/true, unused);
    nlohmann::json out = response_json("failed");
    out["error"] = {{"code", "server_error"}, {"message", message}};
    return out;
  }

  // Stores a finished response for previous_response_id and GET, unless store is false. A
  // background response is stored queued first, in_progress at its first output, then once more
  // when it ends (completed, incomplete, failed or cancelled), and never again after that.
  void keep(const nlohmann::json& response) {
    if (!request_.store || final_stored_) return;
    final_stored_ = response["status"] != "queued" && response["status"] != "in_progress";
    StoredResponse entry;
    entry.id = id();
    entry.conversation = conversation_;
    entry.conversation.push_back(output_.chat_message());
    entry.response = response;
    entry.input_items = input_items_with_ids(request_.input);
    if (!context_.responses().put(std::move(entry))) {
      M3_LOG_WARN("{}: not stored: larger than the whole response store (--max-stored-response-bytes)",
                  id());
    }
  }

  ResponsesRequest request_;
  Json conversation_;  // history and input as chat messages, without the instructions
  double temperature_, top_p_;
  ResponseOutputBuilder output_;
  int64_t sequence_ = 0;
  int64_t reasoning_tokens_ = 0;
  bool final_stored_ = false;     // keep() has stored the response's end
  bool progress_stored_ = false;  // background: stored as in_progress at its first output
};

// The {id} of /v1/responses/{id} and /v1/responses/{id}/input_items.
std::string response_id_of(const HttpRequest& req) {
  const std::string rest = req.path.substr(kResponsesPath.size() + 1);
  return rest.substr(0, rest.find('/'));
}

// GET /v1/responses/{id}/input_items: the request's input items, a cursor page as OpenAI's
// (limit 1-100, default 20; order desc by default; after / before an item id).
nlohmann::json input_items_page(const StoredResponse& stored, const HttpRequest& req) {
  int64_t limit = 20;
  bool ascending = false;
  std::optional<std::string> after, before;
  for (const auto& [key, value] : query_parameters(req.target)) {
    if (key == "limit") {
      char* end = nullptr;
      limit = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || limit < 1 || limit > 100) {
        bad_field("limit", "must be an integer in [1, 100], got '{}'", value);
      }
    } else if (key == "order") {
      if (value != "asc" && value != "desc") bad_field("order", "must be asc or desc, got '{}'", value);
      ascending = value == "asc";
    } else if (key == "after") {
      after = value;
    } else if (key == "before") {
      before = value;
    } else {
      bad_field(key, "is not a parameter of this list (limit, order, after, before)");
    }
  }
  nlohmann::json items = stored.input_items;
  if (!ascending) std::reverse(items.begin(), items.end());
  auto position = [&](const std::string& id, const char* param) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i]["id"] == id) return i;
    }
    bad_field(param, "'{}' is not an input item of response '{}'", id, stored.id);
  };
  size_t begin = after ? position(*after, "after") + 1 : 0;
  size_t end = before ? position(*before, "before") : items.size();
  end = std::max(begin, end);
  const size_t last = std::min(end, begin + static_cast<size_t>(limit));
  nlohmann::json data = nlohmann::json::array();
  for (size_t i = begin; i < last; ++i) data.push_back(items[i]);
  return {{"object", "list"},
          {"data", data},
          {"first_id", data.empty() ? nlohmann::json(nullptr) : data.front()["id"]},
          {"last_id", data.empty() ? nlohmann::json(nullptr) : data.back()["id"]},
          {"has_more", last < end}};
}

[[noreturn]] void no_such_response(const std::string& id) {
  throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "response_id");
}

}  // namespace

void handle_responses(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  Json body = parse_json_body(req);
  ResponsesRequest request = parse_responses_request(body, context.options().request_limits);
  check_model_name(context, request.chat.common.model);

  Json conversation = Json::array();
  if (request.previous_response_id) {
    auto previous = context.responses().get(*request.previous_response_id);
    if (!previous) {
      throw ApiError(404,
                     fmt::format("Previous response with id '{}' not found: it was never stored "
                                 "(store: false), was deleted, or was evicted from the response "
                                 "store.",
                                 *request.previous_response_id),
                     "previous_response_id");
    }
    const std::string status = previous->response.value("status", "");
    if (status == "queued" || status == "in_progress") {
      throw ApiError(400,
                     fmt::format("Previous response with id '{}' is still running (background): poll GET "
                                 "/v1/responses/{} until it has finished.",
                                 *request.previous_response_id, *request.previous_response_id),
                     "previous_response_id");
    }
    conversation = previous->conversation;
  }
  for (Json& message : input_messages(request.input, conversation)) {
    conversation.push_back(std::move(message));
  }
  request.chat.messages = compose_messages(request.instructions, conversation);
  ChatGeneration g = prepare_chat_generation(context.options(), *model, request.chat,
                                             {.prompt = "input", .max_tokens = "max_output_tokens"});

  auto s = std::make_shared<ResponsesSession>(context, model, std::move(request),
                                              std::move(conversation), g.sampling, arrival);
  auto choice = std::make_unique<ChoiceState>(model->tokenizer, g.text);
  choice->prompt_tokens = static_cast<int>(g.prompt.token_ids.size());
  s->choices().push_back(std::move(choice));
  s->job().submit(make_engine_requests(s->id(), g.prompt.token_ids, g.sampling, 1, *model));
  M3_LOG_DEBUG("responses {}: {} prompt tokens, max_output_tokens={}", s->id(),
               g.prompt.token_ids.size(), g.max_tokens);
  if (!s->background()) return s->respond(req, res);
  // Background: stored queued and answered at once; the response runs on the background tasks'
  // thread with no client, and a cancel reaches it through the context.
  auto writer = std::make_shared<DetachedWriter>(context.background_tasks());
  // Weak references: the registry must not keep a finished response (or its writer) alive.
  const bool admitted = context.add_background(s->id(), [session = std::weak_ptr<ResponsesSession>(s),
                                                         weak_writer = std::weak_ptr<DetachedWriter>(writer)] {
    auto w = weak_writer.lock();
    if (!w) return;
    w->post([session, weak_writer] {
      auto live = session.lock();
      auto w = weak_writer.lock();
      if (live && w) live->cancel(*w);
    });
  });
  if (!admitted) {  // `s` goes now, and its job with it
    throw ApiError(429,
                   fmt::format("{} background responses are running, as many as the response store holds "
                               "(--max-stored-responses); wait for some to finish or cancel them",
                               context.options().response_store.max_entries),
                   "background");
  }
  s->keep_queued();
  res.set_header("X-Request-Id", s->id());
  send_json(res, dump_json(s->queued_json()));
  context.background_tasks().post([s, writer] { s->start_detached(writer); });
}

// A running background response's end, once its cancel (or its own end) has been stored: what
// POST .../cancel and DELETE wait for (bounded).
std::shared_ptr<const StoredResponse> wait_until_ended(ServerContext& context, const std::string& id) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto stored = context.responses().get(id);
    const std::string status = stored ? stored->response.value("status", "") : "";
    // Not stored while still running: the store let it go, and its end stores it again.
    const bool running = stored ? status == "queued" || status == "in_progress" : bool(context.background_cancel(id));
    if (!running || std::chrono::steady_clock::now() > deadline) return stored;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void register_responses_routes(HttpServer& http, ServerContext& context) {
  http.post(std::string(kResponsesPath), [&context](const HttpRequest& req, HttpResponse& res) {
    handle_responses(context, req, res);
  });
  const std::string by_id = std::string(kResponsesPath) + "/{}";
  http.get(by_id, [&context](const HttpRequest& req, HttpResponse& res) {
    const std::string id = response_id_of(req);
    auto stored = context.responses().get(id);
    if (!stored) no_such_response(id);
    send_json(res, dump_json(stored->response));
  });
  // Cancel a background response: "cancelled" with its output so far; one that has ended is
  // returned as it is (OpenAI's); only background responses can be cancelled.
  http.post(by_id + "/cancel", [&context](const HttpRequest& req, HttpResponse& res) {
    const std::string id = response_id_of(req);
    std::shared_ptr<const StoredResponse> stored;
    if (auto cancel = context.background_cancel(id)) {  // running (even if the store let it go)
      cancel();
      stored = wait_until_ended(context, id);
      if (!stored) no_such_response(id);
    } else {
      stored = context.responses().get(id);
      if (!stored) no_such_response(id);
      if (!stored->response.value("background", false)) {
        throw ApiError(400, fmt::format("Response '{}' was not created with background: true; only those can be "
                                        "cancelled.", id), "response_id");
      }
    }
    send_json(res, dump_json(stored->response));
  });
  http.del(by_id, [&context](const HttpRequest& req, HttpResponse& res) {
    const std::string id = response_id_of(req);
    if (auto cancel = context.background_cancel(id)) {  // it would be stored again when it ends
      cancel();
      wait_until_ended(context, id);
    }
    if (!context.responses().erase(id)) no_such_response(id);
    send_json(res, dump_json({{"id", id}, {"object", "response"}, {"deleted", true}}));
  });
  http.get(by_id + "/input_items", [&context](const HttpRequest& req, HttpResponse& res) {
    const std::string id = response_id_of(req);
    auto stored = context.responses().get(id);
    if (!stored) no_such_response(id);
    send_json(res, dump_json(input_items_page(*stored, req)));
  });
}

}  // namespace m3::server
