// POST /v1/chat/completions: messages -> chat template -> tokens -> n samples, each through the
// text pipeline (detokenize, stop strings, reasoning split, tool calls), streamed as
// chat.completion.chunk events or returned as one chat.completion.
//
// Reasoning is reported as `reasoning_content` (vLLM's long-standing field, also DeepSeek's) and
// as `reasoning` (vLLM's newer name), so clients of either generation find it.
#include <httplib.h>

#include <cctype>
#include <optional>

#include "core/log.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/route_common.h"
#include "server/routes.h"
#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::server {
namespace {

struct ChatSession {
  ChatSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
              ChatRequest request, GenerationJob::Clock::time_point arrival)
      : context(context),
        model(std::move(model)),
        request(std::move(request)),
        in_flight(context),
        job(*this->model->engine, context.metrics(), arrival),
        strings(this->model->tokenizer),
        id(make_response_id("chatcmpl-")),
        created(unix_time_seconds()) {}

  ServerContext& context;
  std::shared_ptr<const ModelContext> model;
  ChatRequest request;
  ServerContext::InFlight in_flight;
  GenerationJob job;
  TokenStrings strings;
  std::string id;
  int64_t created;
  std::vector<int32_t> prompt_ids;
  bool reasoning = false;  // a reasoning parser splits the output
  std::vector<std::unique_ptr<ChoiceState>> choices;

  nlohmann::json envelope() const {
    return {{"id", id},
            {"object", "chat.completion.chunk"},
            {"created", created},
            {"model", context.model_name()}};
  }
  nlohmann::json chunk(nlohmann::json choice) const {
    nlohmann::json out = envelope();
    out["choices"] = nlohmann::json::array({std::move(choice)});
    return out;
  }
  nlohmann::json logprobs_json(ChoiceState& choice) {
    if (request.common.logprobs < 0) return nullptr;
    nlohmann::json content = chat_logprob_entries(choice.logprobs, strings, request.top_logprobs);
    choice.logprobs.clear();
    return {{"content", std::move(content)}};
  }
};

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

// Streams the job as chat.completion.chunk events; false when the client went away.
bool stream_chat(ChatSession& s, httplib::DataSink& sink) {
  const CommonRequest& common = s.request.common;
  auto send = [&](nlohmann::json chunk, const ChoiceState& choice) {
    if (common.include_usage) {
      chunk["usage"] =
          common.continuous_usage_stats
              ? usage_json(choice.prompt_tokens, choice.completion_tokens, choice.cached_tokens)
              : nlohmann::json(nullptr);
    }
    return write_chunk(sink, sse_event(chunk));
  };
  // The first chunk of every choice announces the role, before any generation.
  for (int c = 0; c < static_cast<int>(s.choices.size()); ++c) {
    nlohmann::json first = {{"index", c},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}};
    if (!send(s.chunk(std::move(first)), *s.choices[c])) {
      s.job.abort_all();
      count_abandoned(s.context.metrics(), s.choices);
      return false;
    }
  }
  std::string error;
  auto on_event = [&](const ChoiceEvent& event) {
    ChoiceState& choice = *s.choices[event.choice];
    const bool was_ended = choice.ended;
    ChoiceDelta delta =
        apply_output(choice, event.output, event.choice, s.job, common.stop_token_ids);
    if (was_ended) return true;
    if (choice.ended) count_finished(s.context.metrics(), choice);
    if (choice.ended && choice.end.finish_reason == "error") error = choice.error;
    if (delta.empty() && choice.logprobs.empty() && !choice.ended) return true;
    nlohmann::json out = {{"index", event.choice},
                          {"delta", delta_json(delta)},
                          {"logprobs", s.logprobs_json(choice)},
                          {"finish_reason", choice.ended ? nlohmann::json(choice.end.finish_reason)
                                                         : nlohmann::json(nullptr)}};
    if (choice.ended) {
      out["stop_reason"] = choice.end.stop_reason;
      if (common.return_token_ids) out["token_ids"] = choice.output_ids;
    }
    const bool sent = send(s.chunk(std::move(out)), choice);
    if (sent && !event.output.new_token_ids.empty()) {
      s.context.metrics().observe_token_to_socket(std::chrono::duration<double>(
          GenerationJob::Clock::now() - event.emitted_at).count());
    }
    return sent;
  };
  if (!pump_job(
          s.job, [&] { return sink.is_writable(); }, on_event)) {
    count_abandoned(s.context.metrics(), s.choices);
    return false;
  }
  if (!error.empty()) {
    write_chunk(sink, sse_event(error_json(500, error)));
  } else if (common.include_usage) {
    nlohmann::json usage_chunk = s.envelope();
    usage_chunk["choices"] = nlohmann::json::array();
    usage_chunk["usage"] = total_usage(s.choices);
    if (!write_chunk(sink, sse_event(usage_chunk))) return false;
  }
  write_chunk(sink, kSseDone);
  sink.done();
  return true;
}

nlohmann::json message_json(const ChatSession& s, const ChoiceState& choice) {
  const ChoiceOutput& out = choice.text;
  nlohmann::json message = {{"role", "assistant"}};
  const bool has_calls = !out.tool_calls().empty();
  // As vLLM: no content is null when something else (tool calls, reasoning) was produced.
  const bool content_null = out.content().empty() && (has_calls || !out.reasoning().empty());
  message["content"] = content_null ? nlohmann::json(nullptr) : nlohmann::json(out.content());
  if (s.reasoning) {
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

// Waits for every choice, then writes one chat.completion object; false when the client left.
bool complete_chat(ChatSession& s, httplib::DataSink& sink) {
  auto on_event = [&](const ChoiceEvent& event) {
    ChoiceState& choice = *s.choices[event.choice];
    const bool was_ended = choice.ended;
    apply_output(choice, event.output, event.choice, s.job, s.request.common.stop_token_ids);
    if (!was_ended && choice.ended) count_finished(s.context.metrics(), choice);
    return true;
  };
  if (!pump_job(
          s.job, [&] { return sink.is_writable(); }, on_event)) {
    count_abandoned(s.context.metrics(), s.choices);
    return false;
  }
  nlohmann::json body = s.envelope();
  body["object"] = "chat.completion";
  body["choices"] = nlohmann::json::array();
  for (int c = 0; c < static_cast<int>(s.choices.size()); ++c) {
    ChoiceState& choice = *s.choices[c];
    if (choice.end.finish_reason == "error") {
      // The 200 status is already on the wire (see route_common.h); the body says what failed.
      write_chunk(sink, dump_json(error_json(500, choice.error)));
      sink.done();
      return true;
    }
    nlohmann::json out = {{"index", c},
                          {"message", message_json(s, choice)},
                          {"logprobs", s.logprobs_json(choice)},
                          {"finish_reason", choice.end.finish_reason},
                          {"stop_reason", choice.end.stop_reason}};
    if (s.request.common.return_token_ids) out["token_ids"] = choice.output_ids;
    body["choices"].push_back(std::move(out));
  }
  body["usage"] = total_usage(s.choices);
  if (s.request.common.return_token_ids) body["prompt_token_ids"] = s.prompt_ids;
  write_chunk(sink, dump_json(body));
  sink.done();
  return true;
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
void force_tool_call(const ServeOptions& options, const ChatRequest& r, const std::string& prompt_text,
                     const text::Tokenizer& tokenizer, SamplingParams& sampling) {
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
  while (!prompt.empty() && std::isspace(static_cast<unsigned char>(prompt.back()))) prompt.remove_suffix(1);
  if (!prompt.ends_with(end)) sampling.forced_after = tokenizer.encode(end, false);
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

void handle_chat_completions(ServerContext& context, const httplib::Request& req,
                             httplib::Response& res) {
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
  force_tool_call(context.options(), request, prompt.text, model->tokenizer, sampling);

  auto s = std::make_shared<ChatSession>(context, model, std::move(request), arrival);
  const ChatRequest& r = s->request;
  // Engine ids are always the response id (unique); a client's X-Request-Id is echoed back and
  // logged, but two clients may well send the same one.
  const std::string& request_id = s->id;
  std::string client_request_id = req.get_header_value("X-Request-Id");
  res.set_header("X-Request-Id", client_request_id.empty() ? request_id : client_request_id);

  ChoiceTextOptions options = text_options(context.options(), r, prompt.text);
  s->reasoning = !options.reasoning_parser.empty();
  for (int j = 0; j < r.common.n; ++j) {
    auto choice = std::make_unique<ChoiceState>(model->tokenizer, options);
    choice->prompt_tokens = static_cast<int>(prompt.token_ids.size());
    s->choices.push_back(std::move(choice));
  }
  s->prompt_ids = prompt.token_ids;
  s->job.submit(make_engine_requests(request_id, prompt.token_ids, sampling, r.common.n, *model));
  M3_LOG_DEBUG("chat {}: {} prompt tokens, n={}, max_tokens={}", request_id,
               prompt.token_ids.size(), r.common.n, max_tokens);

  // A chunked response even when not streaming: the provider runs while the client waits, so a
  // client that hangs up is noticed (sink.is_writable) and its requests are aborted at once.
  if (r.common.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [s](size_t, httplib::DataSink& sink) {
      return stream_chat(*s, sink);
    });
  } else {
    res.set_chunked_content_provider("application/json", [s](size_t, httplib::DataSink& sink) {
      return complete_chat(*s, sink);
    });
  }
}

}  // namespace m3::server
