#include "loadgen/replay.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "loadgen/chat_stream.h"
#include "loadgen/replay_clock.h"
#include "loadgen/report.h"

namespace m3::loadgen {

namespace {

using Clock = std::chrono::steady_clock;

// One replay of one session tree, shared by its agents' threads.
struct SessionReplay {
  SessionReplay(const Session& s, int lane_index, int replay_index, std::string m, PromptBuilder t,
                std::atomic<int>& requests)
      : session(s), lane(lane_index), replay(replay_index), marker(std::move(m)), text(t), lane_requests(requests) {}
  int64_t marker_tokens = 0;
  const Session& session;
  int lane, replay;
  std::string marker;
  PromptBuilder text;
  std::atomic<int>& lane_requests;  // the lane's requests so far (warm-up)
  std::mutex seen_mu;
  std::unordered_set<int64_t> seen;  // block ids this replay sent (the infinite cache)
  std::atomic<int64_t> unique_ids{0};
};

class Replayer {
 public:
  Replayer(const std::vector<Session>& sessions, const WordPool& words, const ReplayOptions& o, LiveCounters& live)
      : sessions_(sessions), words_(words), o_(o), live_(live) {}

  RunResult run() {
    start_ = Clock::now();
    std::vector<std::thread> lanes;
    std::atomic<int> running{o_.concurrency};
    for (int lane = 0; lane < o_.concurrency; ++lane) {
      lanes.emplace_back([this, lane, &running] {
        run_lane(lane);
        if (--running == 0) clock_.stop();
      });
    }
    // The time limit: no request starts after it; those in flight finish.
    clock_.wait_for_stop(o_.duration_s);
    clock_.stop();
    for (std::thread& t : lanes) t.join();
    RunResult r;
    r.concurrency = o_.concurrency;
    r.wall_s = seconds_since_start();
    r.context_resets = context_resets_;
    r.skipped_idle_s = clock_.skipped_s();
    r.requests = std::move(requests_);
    r.replays = std::move(replays_);
    std::sort(r.requests.begin(), r.requests.end(),
              [](const RequestRecord& a, const RequestRecord& b) { return a.start_s < b.start_s; });
    return r;
  }

 private:
  double seconds_since_start() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void run_lane(int lane) {
    std::atomic<int> lane_requests{0};
    while (!clock_.stopped()) {
      const int index = next_replay_++;
      if (o_.max_replays > 0 && index >= o_.max_replays) break;
      const Session& session = sessions_[static_cast<size_t>(index) % sessions_.size()];
      SessionReplay replay(session, lane, index, cache_bust_marker(o_.run_nonce, index),
                           PromptBuilder(words_, scope_of(session)), lane_requests);
      if (o_.marker_tokens) replay.marker_tokens = o_.marker_tokens(replay.marker);
      ReplayRecord record{lane, index, session.id, replay.marker, seconds_since_start(), 0};
      run_agent(replay, session.main, start_turn(session, index));
      record.end_s = seconds_since_start();
      std::lock_guard lock(mu_);
      replays_.push_back(std::move(record));
    }
  }

  // The main-agent request a replay starts at: a fraction of its requests drawn from
  // [trajectory_start_min, trajectory_start_max] (0 and 0: the first), fixed by the run's nonce.
  int start_turn(const Session& session, int index) const {
    if (o_.trajectory_start_max <= 0) return 0;
    int requests = 0;
    for (const AgentStep& s : session.main.steps) requests += s.request ? 1 : 0;
    uint64_t x = (o_.run_nonce ^ 0xA5A5A5A5ull) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
    x = (x ^ (x >> 29)) * 0xBF58476D1CE4E5B9ull;
    const double u = ((x ^ (x >> 32)) >> 11) * 0x1.0p-53;
    const double ratio = o_.trajectory_start_min + (o_.trajectory_start_max - o_.trajectory_start_min) * u;
    return std::clamp(static_cast<int>(ratio * requests), 0, std::max(requests - 1, 0));
  }

  // Runs the agent's steps; with `skip` > 0 its first `skip` requests (and the sub-agents among
  // them) are passed over and the first one sent carries the whole context so far (a prefill
  // that primes the cache, sent without a wait).
  void run_agent(SessionReplay& replay, const Agent& agent, int skip = 0) {
    ConversationState conversation;
    std::vector<std::thread> waited, background;
    int64_t last_out = 0;
    double last_end_t = agent.t;
    int turn = 0;
    const int first_turn = skip;
    for (const AgentStep& step : agent.steps) {
      if (skip > 0 && step.subagent) continue;
      if (skip > 0) {
        --skip;
        ++turn;
        last_out = step.request->out;
        last_end_t = step.request->t + step.request->api_time.value_or(0.0);
        continue;
      }
      if (step.subagent) {
        if (clock_.stopped()) continue;
        const Agent& sub = *step.subagent;
        (sub.background ? background : waited).emplace_back([this, &replay, &sub] { run_agent(replay, sub); });
        continue;
      }
      // The parent's next turn joins the sub-agents spawned since its last one.
      for (std::thread& t : waited) t.join();
      waited.clear();
      const TraceRequest& q = *step.request;
      RequestRecord r;
      r.recorded_wait_s = q.think_time ? *q.think_time : std::max(0.0, q.t - last_end_t);
      r.wait_s = first_turn > 0 && turn == first_turn ? 0.0 : r.recorded_wait_s * o_.think_time_scale;
      if (!o_.whole_system_idle_cap && o_.idle_cap_s >= 0) r.wait_s = std::min(r.wait_s, o_.idle_cap_s);
      if (!clock_.wait(r.wait_s)) break;
      r.lane = replay.lane;
      r.replay = replay.replay;
      r.turn = turn++;
      r.session = replay.session.id;
      r.agent = agent.id;
      r.trace_in = q.in;
      r.trace_out = q.out;
      r.warmup = replay.lane_requests++ < o_.warmup_requests;
      last_end_t = q.t + q.api_time.value_or(0.0);
      const std::vector<Block> blocks =
          request_blocks(q, replay.session.block_size, replay.unique_ids.fetch_add(1 << 20));
      const std::vector<Message>& messages =
          conversation.next(blocks, replay.session.block_size, agent.system_tokens + agent.tool_tokens, last_out,
                            replay.marker, replay.marker_tokens, replay.text);
      last_out = q.out;
      if (o_.max_context_length > 0 && q.in + q.out > o_.max_context_length) {
        r.status = RequestRecord::Status::skipped;
        r.start_s = seconds_since_start();
        record(std::move(r));
        continue;
      }
      {
        std::lock_guard lock(replay.seen_mu);
        r.theoretical_hit_tokens = infinite_cache_hits(blocks, replay.seen);
      }
      send(messages, q, r);
      record(std::move(r));
    }
    for (std::thread& t : waited) t.join();
    for (std::thread& t : background) t.join();
    context_resets_ += conversation.resets();
  }

  void send(const std::vector<Message>& messages, const TraceRequest& q, RequestRecord& r) {
    nlohmann::json body = {{"model", o_.model},
                           {"max_tokens", std::max<int64_t>(q.out, 1)},
                           {"ignore_eos", true},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (o_.chat) {
      nlohmann::json list = nlohmann::json::array();
      for (const Message& m : messages) list.push_back({{"role", m.role}, {"content", m.text}});
      body["messages"] = std::move(list);
    } else {
      body["prompt"] = flatten(messages);
    }
    const std::string payload = body.dump();
    ++live_.in_flight;
    clock_.request_started();
    const auto start = Clock::now();
    r.start_s = seconds_since_start();
    double last_text_s = -1;
    int64_t text_chunks = 0;
    bool done = false;
    SseParser sse([&](const std::string& data) {
      const ChunkInfo c = parse_chunk(data);
      const double now = std::chrono::duration<double>(Clock::now() - start).count();
      if (!c.error.empty() && r.error.empty()) r.error = c.error;
      if (c.done) done = true;
      if (c.has_text) {
        if (last_text_s < 0) {
          r.ttft_s = now;
        } else {
          r.itl_s.push_back(now - last_text_s);
        }
        last_text_s = now;
        ++text_chunks;
      }
      if (c.has_usage) {
        r.server_usage = true;
        r.prompt_tokens = c.prompt_tokens;
        r.completion_tokens = c.completion_tokens;
        r.cached_tokens = c.cached_tokens;
      }
    });
    const HttpResult http = http_request(o_.endpoint, o_.chat ? "/v1/chat/completions" : "/v1/completions",
                                         payload, o_.api_key, o_.request_timeout,
                                         [&](const char* data, size_t size) { sse.feed(data, size); });
    r.e2e_s = std::chrono::duration<double>(Clock::now() - start).count();
    --live_.in_flight;
    clock_.request_finished();
    if (http.status != 200) {
      r.status = RequestRecord::Status::failed;
      r.error = http.status == 0 ? http.error : fmt::format("HTTP {}: {}", http.status, http.error.substr(0, 500));
    } else if (!r.error.empty()) {
      r.status = RequestRecord::Status::failed;
    } else if (!done || text_chunks == 0) {
      r.status = RequestRecord::Status::failed;
      r.error = done ? "the stream carried no text" : "the stream ended before [DONE]";
    }
    if (!r.server_usage) {
      // No usage from the server: the trace's input and the chunks seen stand in.
      r.prompt_tokens = q.in;
      r.completion_tokens = text_chunks;
    }
    if (r.status == RequestRecord::Status::ok) {
      ++live_.finished;
      live_.output_tokens += r.completion_tokens;
    } else {
      ++live_.failed;
    }
  }

  void record(RequestRecord r) {
    std::lock_guard lock(mu_);
    requests_.push_back(std::move(r));
  }

  const std::vector<Session>& sessions_;
  const WordPool& words_;
  const ReplayOptions& o_;
  LiveCounters& live_;
  // Whole-system mode: the clock skips idle time past the cap; per-wait mode: waits are cut.
  ReplayClock clock_{o_.whole_system_idle_cap ? o_.idle_cap_s : -1.0};
  Clock::time_point start_;
  std::atomic<int> next_replay_{0};
  std::atomic<int64_t> context_resets_{0};
  std::mutex mu_;
  std::vector<RequestRecord> requests_;
  std::vector<ReplayRecord> replays_;
};

}  // namespace

std::string cache_bust_marker(uint64_t run_nonce, int index) {
  uint64_t x = run_nonce * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
  return fmt::format("[rid:{:08x}-{}]", static_cast<uint32_t>(x ^ (x >> 32)), index);
}

RunResult run_replay(const std::vector<Session>& sessions, const WordPool& words, const ReplayOptions& options,
                     LiveCounters& live) {
  M3_CHECK(!sessions.empty(), "no session to replay");
  M3_CHECK(options.concurrency > 0, "--concurrency must be > 0");
  M3_CHECK(options.duration_s > 0 || options.max_replays > 0, "give --duration or --max-replays (or both)");
  Replayer replayer(sessions, words, options, live);
  return replayer.run();
}

}  // namespace m3::loadgen
