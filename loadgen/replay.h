// The replay scheduler. `concurrency` lanes run at once; a lane replays one session tree at a
// time (the main agent's requests in order, each sub-agent on its own thread from its marker on,
// the parent's next request waiting for the sub-agents spawned before it, background ones not
// waited for) and then takes the next session of the corpus (recycling it when the corpus runs
// out). Before each request an agent waits its recorded think time, scaled and capped. Every
// replay of a session gets its own cache-bust marker at the start of its first user message.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loadgen/http_stream_client.h"
#include "loadgen/prompt_text.h"
#include "loadgen/trace.h"

namespace m3::loadgen {

struct ReplayOptions {
  Endpoint endpoint;
  std::string api_key;
  std::string model;
  bool chat = true;                 // /v1/chat/completions, else /v1/completions
  int concurrency = 1;              // live lanes (session trees), not requests in flight
  double duration_s = 0;            // 0: no time limit (then max_replays bounds the run)
  int max_replays = 0;              // session replays started in all (0: no limit)
  double think_time_scale = 1.0;
  double idle_cap_s = 10.0;         // < 0: no cap
  // false: no wait before a request is longer than the cap; true: AgentX's whole-system cap,
  // idle time (no request in flight) past the cap is skipped (loadgen/replay_clock.h).
  bool whole_system_idle_cap = false;
  int warmup_requests = 0;          // per lane: its first requests are sent but not measured
  int64_t max_context_length = 0;   // requests with in + out above it are skipped (0: no limit)
  std::chrono::seconds request_timeout{600};
  // Each replay starts at a main-agent request drawn from this fraction range of its requests
  // (AgentX's trajectory start, 0.25-0.75 there); 0 and 0: at the first request.
  double trajectory_start_min = 0, trajectory_start_max = 0;
  uint64_t run_nonce = 0;           // makes the markers of this run differ from other runs'
  // The server's token count of a marker (the marker then replaces that many prompt words, so
  // the prompt keeps the trace's count); empty: unknown, the marker's tokens come on top.
  std::function<int64_t(const std::string&)> marker_tokens;
};

struct RequestRecord {
  enum class Status { ok, failed, skipped };
  int lane = 0, replay = 0;
  int turn = 0;  // the request's index among its agent's requests in the trace
  std::string session, agent;
  bool warmup = false;
  Status status = Status::ok;
  std::string error;
  double start_s = 0;   // from the run's start
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;  // gaps between chunks that carried text
  int64_t trace_in = 0, trace_out = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;  // the server's usage when it sent one
  int64_t cached_tokens = -1;                        // usage.prompt_tokens_details.cached_tokens
  bool server_usage = false;
  int64_t theoretical_hit_tokens = 0;  // input tokens in blocks this replay had sent before
  double recorded_wait_s = 0, wait_s = 0;  // the trace's think time, and the wait actually made
};

struct ReplayRecord {
  int lane = 0, replay = 0;
  std::string session, marker;
  double start_s = 0, end_s = 0;
};

struct RunResult {
  int concurrency = 0;
  double wall_s = 0;
  int64_t context_resets = 0;  // requests that left their agent's message array (compactions)
  double skipped_idle_s = 0;   // whole-system idle time skipped by the cap
  std::vector<RequestRecord> requests;
  std::vector<ReplayRecord> replays;
};

// Live counts for a progress display (read from another thread).
struct LiveCounters {
  std::atomic<int64_t> finished{0}, failed{0}, output_tokens{0}, in_flight{0};
};

RunResult run_replay(const std::vector<Session>& sessions, const WordPool& words, const ReplayOptions& options,
                     LiveCounters& live);

// The cache-bust marker of replay `index` of a run.
std::string cache_bust_marker(uint64_t run_nonce, int index);

}  // namespace m3::loadgen
