// The engine side of one HTTP request: submits one engine request per choice (n, and every
// prompt of a batched completion), carries their outputs from the engine thread to the
// connection's thread, records latency metrics, and aborts whatever is still running when the
// job is dropped (client gone, stop string, error), so no work outlives its request.
//
// The engine thread never waits here: its sinks append to a queue and, when the queue was
// empty, call the notify function (which only posts a task to the consumer's thread). Outputs
// pile up in the queue while the consumer is held back by a slow client; they are small (token
// ids), and the stall timeout bounds how long that lasts.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/request.h"
#include "server/metrics.h"

namespace m3::server {

struct ChoiceEvent {
  int choice = 0;
  RequestOutput output;
  // When the engine handed the output over (on its thread): the start of the server's own
  // latency, m3:token_to_socket_seconds.
  std::chrono::steady_clock::time_point emitted_at;
};

class GenerationJob {
 public:
  using Clock = std::chrono::steady_clock;

  // `arrival` is when the HTTP request came in (the start of time-to-first-token).
  GenerationJob(EngineCore& engine, ServerMetrics& metrics, Clock::time_point arrival);
  ~GenerationJob();  // aborts unfinished choices
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // Submits the requests as choices 0..n-1 (ids must be unique). If the engine rejects one,
  // those already submitted are aborted and the engine's m3::Error propagates.
  void submit(std::vector<EngineRequest> requests);

  // `notify` runs on the engine thread when outputs arrive and none were waiting to be taken:
  // it must be quick and must not block (it posts take() to the consumer's thread). Set it
  // before or after submit(); outputs that arrived before are taken by the first take().
  void set_notify(std::function<void()> notify);
  // Up to `max` outputs of any choice, in arrival order, without waiting (empty: none yet).
  std::vector<ChoiceEvent> take(size_t max);
  // Every choice has received its final output.
  bool done() const;
  // Stops a choice early (stop string matched); its final kAbort output still arrives.
  void abort(int choice);
  void abort_all();

  int num_choices() const { return static_cast<int>(choices_.size()); }

 private:
  struct Channel {
    std::mutex mutex;
    std::deque<ChoiceEvent> events;
    std::function<void()> notify;  // cleared when the job is dropped
  };
  struct Choice {
    std::string engine_id;
    bool finished = false;
    bool aborted = false;
    bool first_token_seen = false;
    int generated_tokens = 0;
    Clock::time_point last_token_time;
  };
  void observe(Choice& choice, const RequestOutput& output);

  EngineCore& engine_;
  ServerMetrics& metrics_;
  Clock::time_point arrival_;
  std::shared_ptr<Channel> channel_;  // shared with the sinks, which may outlive the job briefly
  std::vector<Choice> choices_;
  int num_finished_ = 0;
};

}  // namespace m3::server
