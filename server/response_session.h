// What the responses of /v1/completions, /v1/chat/completions and /v1/messages share: the engine
// job, its choices, the response id and envelope, the usage bookkeeping, and the event-driven
// loop that carries engine outputs to the client on the connection's thread, as SSE events
// (stream) or one JSON body once every choice has ended. The stream's end and the error shape
// are the route's (stream_end, error_bytes).
//
// Nothing here waits: the engine's sinks post a task to the connection when outputs arrive, the
// task turns them into chunks while the client keeps up (StreamWriter::writable) and otherwise
// waits for it (on_writable); a client that hangs up or stalls (on_close) aborts the job at once,
// so its KV blocks are freed before the engine's next step.
//
// The 200 status goes out before generation (so a hang-up is noticed while the client waits), so
// an engine failure during a non-streaming request arrives as an error object in a 200 body
// (streams send an error event), as before.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/generation_job.h"
#include "server/http_server.h"
#include "server/route_common.h"

namespace m3::server {

class ResponseSession : public std::enable_shared_from_this<ResponseSession> {
 public:
  // `object` is the streamed chunk's "object" ("chat.completion.chunk", "text_completion").
  ResponseSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
                  std::string id_prefix, std::string object, GenerationJob::Clock::time_point arrival);
  virtual ~ResponseSession() = default;
  ResponseSession(const ResponseSession&) = delete;
  ResponseSession& operator=(const ResponseSession&) = delete;

  // Fills in `res` (X-Request-Id, content type, the body producer) for a submitted job.
  void respond(const HttpRequest& req, HttpResponse& res);
  // Instead of respond(): produces the response into `writer` with no client (a background
  // response). Call on the thread `writer` posts to.
  void start_detached(std::shared_ptr<StreamWriter> writer) { start(std::move(writer)); }

  const std::string& id() const { return id_; }
  GenerationJob& job() { return job_; }
  std::vector<std::unique_ptr<ChoiceState>>& choices() { return choices_; }

 protected:
  virtual const CommonRequest& common() const = 0;
  // Streaming: before any output (chat announces the role of every choice).
  virtual void stream_start() {}
  // Streaming: one engine output; sends whatever became final with send_chunk().
  virtual void stream_event(const ChoiceEvent& event) = 0;
  // Not streaming: one engine output, accumulated.
  virtual void collect_event(const ChoiceEvent& event) = 0;
  // Not streaming: the body once every choice has ended (none with an error).
  virtual nlohmann::json whole_body() = 0;
  // Streaming: the tail once every choice has ended: the error event of a failed choice
  // (stream_error()), or the usage chunk when asked for, then [DONE] (the chat and completions
  // stream grammar); a route that speaks another API ends its stream its own way.
  virtual void stream_end();
  // An error as the response's bytes: an SSE event when streaming, else a JSON body. OpenAI's
  // error shape unless the route speaks another API.
  virtual std::string error_bytes(int status, const std::string& message);

  // {"id", "object", "created", "model"} of this response.
  nlohmann::json envelope() const;
  // The envelope with one choice.
  nlohmann::json chunk(nlohmann::json choice) const;
  // The response's usage over every choice, per the server's options.
  nlohmann::json usage() const;
  // Sends one SSE chunk, with the choice's usage when the client asked for continuous usage.
  void send_chunk(nlohmann::json chunk, const ChoiceState& choice);
  // Queues bytes of the body; false once the response has ended.
  bool write(std::string bytes);
  // Applies an output to its choice and counts the choice when it ends; records a failed
  // choice's error for the stream's tail. Returns what became final, or nothing when the choice
  // had already ended (a stop string ended it; later outputs are not sent).
  std::optional<ChoiceDelta> apply(const ChoiceEvent& event);
  int64_t created() const { return created_; }
  // The error of the first failed choice, empty when none failed.
  const std::string& stream_error() const { return stream_error_; }

  ServerContext& context_;
  std::shared_ptr<const ModelContext> model_;
  ServerContext::InFlight in_flight_;
  GenerationJob job_;
  TokenStrings strings_;
  std::vector<std::unique_ptr<ChoiceState>> choices_;

 private:
  void start(std::shared_ptr<StreamWriter> writer);
  // Takes the job's outputs while the client keeps up; ends the response once the job is done.
  void pump();
  void finish();
  void fail(const std::string& message);
  void client_gone();

  std::string id_;
  std::string object_;
  int64_t created_;
  std::shared_ptr<StreamWriter> writer_;  // null before start and once the response ended
  GenerationJob::Clock::time_point produced_at_{};  // of the output being sent
  std::string stream_error_;                        // a choice failed: the stream's error event
  bool ended_ = false;
};

}  // namespace m3::server
