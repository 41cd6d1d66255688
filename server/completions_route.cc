// POST /v1/completions: prompts (text or token ids, batched) -> n samples each, streamed over SSE
// or returned whole. Choices are prompt-major: choice index = prompt index * n + sample.
#include <httplib.h>

#include "core/log.h"
#include "server/api_error.h"
#include "server/route_common.h"
#include "server/routes.h"

namespace m3::server {
namespace {

struct CompletionSession {
  CompletionSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
                    CompletionRequest request, GenerationJob::Clock::time_point arrival)
      : context(context),
        model(std::move(model)),
        request(std::move(request)),
        in_flight(context),
        job(*this->model->engine, context.metrics(), arrival),
        strings(this->model->tokenizer),
        id(make_response_id("cmpl-")),
        created(unix_time_seconds()) {}

  ServerContext& context;
  std::shared_ptr<const ModelContext> model;
  CompletionRequest request;
  ServerContext::InFlight in_flight;
  GenerationJob job;
  TokenStrings strings;
  std::string id;
  int64_t created;
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> prompt_texts;  // for echo
  std::vector<std::unique_ptr<ChoiceState>> choices;
  std::vector<std::unique_ptr<CompletionLogprobs>> logprobs;  // per choice, when requested
  std::vector<int64_t> text_offsets;       // characters of text already sent per choice (logprobs)
  std::vector<char> echo_sent;             // streaming echo: the prompt chunk went out
  bool prompt_logprobs_requested = false;  // by the client (echo + logprobs also asks the engine)

  nlohmann::json envelope() const {
    return {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", context.model_name()}};
  }
  nlohmann::json chunk(nlohmann::json choice) const {
    nlohmann::json out = envelope();
    out["choices"] = nlohmann::json::array({std::move(choice)});
    return out;
  }
};

ChoiceTextOptions text_options(const CompletionRequest& r) {
  ChoiceTextOptions o;
  o.skip_special_tokens = r.common.skip_special_tokens;
  o.stop = r.common.stop;
  o.include_stop_str_in_output = r.common.include_stop_str_in_output;
  return o;
}

// Echo: the prompt's logprob entries come first (the first prompt token has none).
void add_echo_logprobs(CompletionSession& s, int c) {
  ChoiceState& choice = *s.choices[c];
  CompletionLogprobs& lp = *s.logprobs[c];
  const std::vector<int32_t>& ids = s.prompt_ids[choice.prompt_index];
  lp.add_unscored(ids.front());
  if (choice.prompt_logprobs) {
    for (const PositionLogprobs& p : *choice.prompt_logprobs) lp.add(p);
  }
}

nlohmann::json choice_json(CompletionSession& s, int c, std::string text, bool final_chunk) {
  ChoiceState& choice = *s.choices[c];
  nlohmann::json logprobs = nullptr;
  if (s.logprobs[c]) {
    for (const PositionLogprobs& p : choice.logprobs) s.logprobs[c]->add(p);
    choice.logprobs.clear();
    logprobs = s.logprobs[c]->take(s.text_offsets[c]);
    s.text_offsets[c] = s.logprobs[c]->text_length();
  }
  nlohmann::json out = {
      {"index", c},
      {"text", std::move(text)},
      {"logprobs", std::move(logprobs)},
      {"finish_reason", final_chunk ? nlohmann::json(choice.end.finish_reason) : nullptr},
      {"stop_reason", final_chunk ? choice.end.stop_reason : nullptr}};
  if (final_chunk && choice.prompt_logprobs && s.prompt_logprobs_requested) {
    out["prompt_logprobs"] = prompt_logprobs_json(*choice.prompt_logprobs, s.strings);
  }
  if (final_chunk && s.request.common.return_token_ids) {
    out["prompt_token_ids"] = s.prompt_ids[choice.prompt_index];
    out["token_ids"] = choice.output_ids;
  }
  return out;
}

// Streams the job as text_completion chunks; false when the client went away.
bool stream_completion(CompletionSession& s, httplib::DataSink& sink) {
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
  std::string error;
  auto on_event = [&](const ChoiceEvent& event) {
    const int c = event.choice;
    ChoiceState& choice = *s.choices[c];
    const bool was_ended = choice.ended;
    if (s.request.echo && !s.echo_sent[c]) {
      // Echo: the prompt goes first, as its own chunk, once its logprobs (delivered with the
      // first output) are known.
      s.echo_sent[c] = true;
      if (event.output.prompt_logprobs) choice.prompt_logprobs = event.output.prompt_logprobs;
      if (s.logprobs[c]) add_echo_logprobs(s, c);
      if (!send(s.chunk(choice_json(s, c, s.prompt_texts[choice.prompt_index], false)), choice)) {
        return false;
      }
    }
    ChoiceDelta delta = apply_output(choice, event.output, c, s.job, common.stop_token_ids);
    if (was_ended) return true;
    if (choice.ended) count_finished(s.context.metrics(), choice);
    if (choice.ended && choice.end.finish_reason == "error") error = choice.error;
    if (delta.content.empty() && choice.logprobs.empty() && !choice.ended) return true;
    const bool sent = send(s.chunk(choice_json(s, c, std::move(delta.content), choice.ended)), choice);
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

// Waits for every choice, then writes one text_completion object; false when the client left.
bool complete_whole(CompletionSession& s, httplib::DataSink& sink) {
  std::vector<std::string> texts(s.choices.size());
  auto on_event = [&](const ChoiceEvent& event) {
    ChoiceState& choice = *s.choices[event.choice];
    const bool was_ended = choice.ended;
    ChoiceDelta delta =
        apply_output(choice, event.output, event.choice, s.job, s.request.common.stop_token_ids);
    texts[event.choice] += delta.content;
    if (!was_ended && choice.ended) count_finished(s.context.metrics(), choice);
    return true;
  };
  if (!pump_job(
          s.job, [&] { return sink.is_writable(); }, on_event)) {
    count_abandoned(s.context.metrics(), s.choices);
    return false;
  }
  nlohmann::json body = s.envelope();
  body["choices"] = nlohmann::json::array();
  for (int c = 0; c < static_cast<int>(s.choices.size()); ++c) {
    ChoiceState& choice = *s.choices[c];
    if (choice.end.finish_reason == "error") {
      // The 200 status is already on the wire (see route_common.h); the body says what failed.
      write_chunk(sink, dump_json(error_json(500, choice.error)));
      sink.done();
      return true;
    }
    if (s.logprobs[c] && s.request.echo) add_echo_logprobs(s, c);
    std::string text = s.request.echo ? s.prompt_texts[choice.prompt_index] + texts[c] : texts[c];
    body["choices"].push_back(choice_json(s, c, std::move(text), true));
  }
  body["usage"] = total_usage(s.choices);
  write_chunk(sink, dump_json(body));
  sink.done();
  return true;
}

}  // namespace

void handle_completions(ServerContext& context, const httplib::Request& req,
                        httplib::Response& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  Json body = parse_json_body(req);
  CompletionRequest request = parse_completion_request(body, context.options().request_limits);
  check_model_name(context, request.common.model);
  const bool prompt_logprobs_requested = request.common.prompt_logprobs >= 0;
  // Echo with logprobs reports the prompt's logprobs too.
  if (request.echo && request.common.logprobs >= 0) {
    request.common.prompt_logprobs =
        std::max(request.common.prompt_logprobs, request.common.logprobs);
  }

  auto s = std::make_shared<CompletionSession>(context, model, std::move(request), arrival);
  const CompletionRequest& r = s->request;
  s->prompt_logprobs_requested = prompt_logprobs_requested;
  // Engine ids are always the response id (unique); a client's X-Request-Id is echoed back and
  // logged, but two clients may well send the same one.
  const std::string& request_id = s->id;
  std::string client_request_id = req.get_header_value("X-Request-Id");
  res.set_header("X-Request-Id", client_request_id.empty() ? request_id : client_request_id);

  std::vector<std::vector<EngineRequest>> engine_requests;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const PromptInput& prompt = r.prompts[p];
    std::string field = r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", p);
    std::vector<int32_t> ids = prompt.is_token_ids
                                   ? prompt.token_ids
                                   : model->tokenizer.encode(prompt.text, r.add_special_tokens);
    check_prompt_ids(ids, model->vocab_size, field);
    int max_tokens = resolve_max_tokens(r.common, *model, static_cast<int>(ids.size()), field);
    SamplingParams sampling = make_sampling_params(r.common, model->defaults, max_tokens);
    std::string prefix = r.prompts.size() == 1 ? request_id : fmt::format("{}-p{}", request_id, p);
    engine_requests.push_back(make_engine_requests(prefix, ids, sampling, r.common.n, *model));
    s->prompt_texts.push_back(prompt.is_token_ids ? model->tokenizer.decode(ids, false)
                                                  : prompt.text);
    s->prompt_ids.push_back(std::move(ids));
  }
  for (size_t p = 0; p < engine_requests.size(); ++p) {
    for (int j = 0; j < r.common.n; ++j) {
      auto choice = std::make_unique<ChoiceState>(model->tokenizer, text_options(r));
      choice->prompt_index = static_cast<int>(p);
      choice->prompt_tokens = static_cast<int>(s->prompt_ids[p].size());
      s->choices.push_back(std::move(choice));
      s->logprobs.push_back(r.common.logprobs >= 0 ? std::make_unique<CompletionLogprobs>(
                                                         s->strings, r.common.logprobs)
                                                   : nullptr);
      s->text_offsets.push_back(0);
      s->echo_sent.push_back(0);
    }
  }
  for (auto& requests : engine_requests) s->job.submit(std::move(requests));
  M3_LOG_DEBUG("completion {}: {} prompt(s) x {}", request_id, r.prompts.size(), r.common.n);

  // A chunked response even when not streaming: the provider runs while the client waits, so a
  // client that hangs up is noticed (sink.is_writable) and its requests are aborted at once.
  if (r.common.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [s](size_t, httplib::DataSink& sink) {
      return stream_completion(*s, sink);
    });
  } else {
    res.set_chunked_content_provider("application/json", [s](size_t, httplib::DataSink& sink) {
      return complete_whole(*s, sink);
    });
  }
}

}  // namespace m3::server
