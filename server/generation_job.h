// The engine side of one HTTP request: submits one engine request per choice (n, and every
// prompt of a batched completion), carries their outputs from the engine thread to the HTTP
// worker thread, records latency metrics, and aborts whatever is still running when the job is
// dropped (client gone, stop string, error), so no work outlives its request.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
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

  // Waits up to `timeout` for outputs of any choice; returns them in arrival order (empty on
  // timeout, so the caller can check on its client).
  std::vector<ChoiceEvent> wait(std::chrono::milliseconds timeout);
  // Every choice has received its final output.
  bool done() const;
  // Stops a choice early (stop string matched); its final kAbort output still arrives.
  void abort(int choice);
  void abort_all();

  int num_choices() const { return static_cast<int>(choices_.size()); }

 private:
  struct Channel {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<ChoiceEvent> events;
  };
  struct Choice {
    std::string engine_id;
    bool finished = false;
    bool aborted = false;
    bool first_token_seen = false;
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
