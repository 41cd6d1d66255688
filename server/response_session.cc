#include "server/response_session.h"

#include "core/log.h"
#include "server/api_error.h"

namespace m3::server {
namespace {

// Outputs turned into chunks per turn before the client's backlog is checked again.
constexpr size_t kOutputsPerTurn = 64;

}  // namespace

ResponseSession::ResponseSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
                                 std::string id_prefix, std::string object,
                                 GenerationJob::Clock::time_point arrival)
    : context_(context),
      model_(std::move(model)),
      in_flight_(context),
      job_(*model_->engine, context.metrics(), arrival),
      strings_(model_->tokenizer),
      id_(make_response_id(id_prefix)),
      object_(std::move(object)),
      created_(unix_time_seconds()) {}

void ResponseSession::respond(const HttpRequest& req, HttpResponse& res) {
  // Engine ids are always the response id (unique); a client's X-Request-Id is echoed back and
  // logged, but two clients may well send the same one.
  std::string_view client_request_id = req.header("X-Request-Id");
  res.set_header("X-Request-Id", client_request_id.empty() ? id_ : std::string(client_request_id));
  if (common().stream) {
    res.set_header("Cache-Control", "no-cache");
    res.content_type = "text/event-stream";
  } else {
    res.content_type = "application/json";
  }
  res.producer = [self = shared_from_this()](std::shared_ptr<StreamWriter> writer) {
    self->start(std::move(writer));
  };
}

void ResponseSession::start(std::shared_ptr<StreamWriter> writer) {
  auto keep = shared_from_this();  // ending the response may drop the last other reference
  writer_ = std::move(writer);
  // The writer keeps the session alive until the response ends; the engine side holds only
  // weak references, so a late output after that finds nothing to do.
  writer_->on_close([self = shared_from_this()] { self->client_gone(); });
  job_.set_notify([writer = std::weak_ptr<StreamWriter>(writer_),
                   session = weak_from_this()] {
    if (auto w = writer.lock()) {
      w->post([session] {
        if (auto s = session.lock()) s->pump();
      });
    }
  });
  try {
    if (common().stream) stream_start();
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  pump();
}

void ResponseSession::pump() {
  if (ended_) return;
  auto keep = shared_from_this();  // ending the response may drop the last other reference
  try {
    for (;;) {
      if (common().stream && !writer_->writable()) {
        writer_->on_writable([session = weak_from_this()] {
          if (auto s = session.lock()) s->pump();
        });
        return;
      }
      std::vector<ChoiceEvent> events = job_.take(kOutputsPerTurn);
      if (events.empty()) break;
      for (const ChoiceEvent& event : events) {
        if (common().stream) {
          produced_at_ = event.output.new_token_ids.empty() ? GenerationJob::Clock::time_point{}
                                                            : event.emitted_at;
          stream_event(event);
          produced_at_ = {};
        } else {
          collect_event(event);
        }
        if (ended_) return;
      }
    }
    if (job_.done()) finish();
  } catch (const std::exception& e) {
    M3_LOG_ERROR("{}: {}", id_, e.what());
    fail(e.what());
  }
}

void ResponseSession::finish() {
  if (common().stream) {
    stream_end();
  } else {
    std::string failure;
    for (const auto& choice : choices_) {
      if (choice->end.finish_reason == "error") {
        failure = choice->error;
        break;
      }
    }
    // The 200 status is already on the wire (see above); the body says what failed.
    write(failure.empty() ? dump_json(whole_body()) : error_bytes(500, failure));
  }
  ended_ = true;
  auto writer = std::move(writer_);
  writer->finish();
}

void ResponseSession::stream_end() {
  if (!stream_error_.empty()) {
    write(error_bytes(500, stream_error_));
  } else if (common().include_usage) {
    nlohmann::json usage_chunk = envelope();
    usage_chunk["choices"] = nlohmann::json::array();
    usage_chunk["usage"] = usage();
    write(sse_event(usage_chunk));
  }
  write(std::string(kSseDone));
}

std::string ResponseSession::error_bytes(int status, const std::string& message) {
  const nlohmann::json error = error_json(status, message);
  return common().stream ? sse_event(error) : dump_json(error);
}

void ResponseSession::fail(const std::string& message) {
  if (ended_) return;
  job_.abort_all();
  count_abandoned(context_.metrics(), choices_);
  write(error_bytes(500, fmt::format("internal server error: {}", message)));
  ended_ = true;
  auto writer = std::move(writer_);
  if (writer) writer->finish();
}

void ResponseSession::client_gone() {
  if (ended_) return;
  ended_ = true;
  writer_.reset();
  job_.abort_all();
  count_abandoned(context_.metrics(), choices_);
}

bool ResponseSession::write(std::string bytes) {
  return writer_ && writer_->write(std::move(bytes), produced_at_);
}

nlohmann::json ResponseSession::envelope() const {
  return {{"id", id_}, {"object", object_}, {"created", created_}, {"model", context_.model_name()}};
}

nlohmann::json ResponseSession::chunk(nlohmann::json choice) const {
  nlohmann::json out = envelope();
  out["choices"] = nlohmann::json::array({std::move(choice)});
  return out;
}

nlohmann::json ResponseSession::usage() const {
  return total_usage(choices_, context_.options().enable_prompt_tokens_details);
}

void ResponseSession::send_chunk(nlohmann::json chunk, const ChoiceState& choice) {
  if (common().include_usage) {
    chunk["usage"] =
        common().continuous_usage_stats
            ? usage_json(choice.prompt_tokens, choice.completion_tokens,
                         context_.options().enable_prompt_tokens_details
                             ? std::optional<int64_t>(choice.cached_tokens)
                             : std::nullopt)
            : nlohmann::json(nullptr);
  }
  write(sse_event(chunk));
}

std::optional<ChoiceDelta> ResponseSession::apply(const ChoiceEvent& event) {
  ChoiceState& choice = *choices_[event.choice];
  const bool was_ended = choice.ended;
  ChoiceDelta delta =
      apply_output(choice, event.output, event.choice, job_, common().stop_token_ids);
  if (!was_ended && choice.ended) {
    count_finished(context_.metrics(), choice);
    if (choice.end.finish_reason == "error" && stream_error_.empty()) stream_error_ = choice.error;
  }
  if (was_ended) return std::nullopt;
  return delta;
}

}  // namespace m3::server
