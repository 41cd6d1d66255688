// AgentX-style numbers of one run (one concurrency level): latency distributions, E2E-normalised
// interactivity, token throughput (per GPU too), prefix hit rates (the server's, from /metrics
// and from usage, and the infinite-cache one of the traces' block ids) and request accounting.
// docs/agentic-bench.md gives each definition.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loadgen/prompt_text.h"
#include "loadgen/replay.h"

namespace m3::loadgen {

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

// Linear interpolation between closest ranks (numpy's default), q in [0, 1].
double percentile(std::vector<double> values, double q);
Distribution summarize(const std::vector<double>& values);

// Counters read from /metrics before and after a run.
struct ServerCounters {
  bool available = false;
  double prefix_cache_hits = 0, prefix_cache_queries = 0, prompt_tokens = 0, generation_tokens = 0;
};

struct RunSummary {
  int concurrency = 0;
  int num_gpus = 1;
  double wall_s = 0, measured_s = 0;
  // Accounting: sent = completed + failed; skipped requests (over --max-context-length) were not
  // sent; warm-up requests are sent and counted here but left out of every number below.
  int64_t sent = 0, completed = 0, failed = 0, skipped = 0, warmup = 0, measured = 0, replays = 0;
  int64_t with_server_usage = 0;
  int64_t context_resets = 0;
  Distribution ttft_s, itl_s, tpot_s, e2el_s;
  double interactivity = 0;  // 1 / p90(E2EL_i / OSL_i), tokens/s/user
  int64_t input_tokens = 0, output_tokens = 0, cached_tokens = 0;
  double input_tps = 0, output_tps = 0, total_tps = 0, request_rate = 0;
  double theoretical_hit_rate = 0;  // infinite cache, from the block ids sent
  double usage_cached_rate = -1;    // sum cached_tokens / sum prompt_tokens (-1: no server said)
  double server_hit_rate = -1;      // delta hits / delta queries of /metrics (-1: not available)
  double server_hits = 0, server_queries = 0;
  double max_wait_s = 0, max_recorded_wait_s = 0;
  int64_t capped_waits = 0;
  double skipped_idle_s = 0;
  std::vector<std::string> errors;  // the first few
};

RunSummary summarize_run(const RunResult& run, const ServerCounters& before, const ServerCounters& after,
                         int num_gpus, double idle_cap_s);

// Tokens of `blocks` an infinite cache holding `seen` would hit; adds the blocks to `seen`.
int64_t infinite_cache_hits(const std::vector<Block>& blocks, std::unordered_set<int64_t>& seen);
// The corpus's own infinite-cache hit rate: each session's requests (sub-agents' too) in time
// order against one seen-set per session, hit tokens over input tokens.
double corpus_hit_rate(const std::vector<Session>& sessions);

nlohmann::json to_json(const RunSummary& s);
// The per-request and per-replay records (for --output's "requests" / "replays").
nlohmann::json records_to_json(const RunResult& run);

}  // namespace m3::loadgen
