#include "loadgen/report.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

namespace m3::loadgen {

using nlohmann::json;

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

Distribution summarize(const std::vector<double>& values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = percentile(values, 0.50);
  d.p90 = percentile(values, 0.90);
  d.p95 = percentile(values, 0.95);
  d.p99 = percentile(values, 0.99);
  return d;
}

RunSummary summarize_run(const RunResult& run, const ServerCounters& before, const ServerCounters& after,
                         int num_gpus, double idle_cap_s) {
  RunSummary s;
  s.concurrency = run.concurrency;
  s.num_gpus = std::max(num_gpus, 1);
  s.wall_s = run.wall_s;
  s.replays = static_cast<int64_t>(run.replays.size());
  s.context_resets = run.context_resets;
  s.skipped_idle_s = run.skipped_idle_s;
  std::vector<double> ttft, itl, tpot, e2el, e2e_per_token;
  double first_start = 1e300, last_end = 0;
  int64_t usage_prompt = 0, usage_cached = 0, trace_in = 0, hit_tokens = 0;
  bool any_cached = false;
  for (const RequestRecord& r : run.requests) {
    s.max_wait_s = std::max(s.max_wait_s, r.wait_s);
    s.max_recorded_wait_s = std::max(s.max_recorded_wait_s, r.recorded_wait_s);
    if (idle_cap_s >= 0 && r.recorded_wait_s > idle_cap_s && r.wait_s <= idle_cap_s) ++s.capped_waits;
    if (r.status == RequestRecord::Status::skipped) {
      ++s.skipped;
      continue;
    }
    ++s.sent;
    if (r.warmup) ++s.warmup;
    if (r.status == RequestRecord::Status::failed) {
      ++s.failed;
      if (s.errors.size() < 5) s.errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    if (r.warmup) continue;
    ++s.measured;
    if (r.server_usage) ++s.with_server_usage;
    first_start = std::min(first_start, r.start_s);
    last_end = std::max(last_end, r.start_s + r.e2e_s);
    ttft.push_back(r.ttft_s);
    e2el.push_back(r.e2e_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    const int64_t osl = r.completion_tokens;
    if (osl > 1) tpot.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(osl - 1));
    if (osl > 0) e2e_per_token.push_back(r.e2e_s / static_cast<double>(osl));
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.completion_tokens;
    if (r.cached_tokens >= 0) {
      any_cached = true;
      usage_cached += r.cached_tokens;
      usage_prompt += r.prompt_tokens;
    }
    trace_in += r.trace_in;
    hit_tokens += r.theoretical_hit_tokens;
  }
  s.ttft_s = summarize(ttft);
  s.itl_s = summarize(itl);
  s.tpot_s = summarize(tpot);
  s.e2el_s = summarize(e2el);
  const double p90 = percentile(e2e_per_token, 0.90);
  s.interactivity = p90 > 0 ? 1.0 / p90 : 0.0;
  s.measured_s = s.measured > 0 ? last_end - first_start : 0.0;
  if (s.measured_s > 0) {
    s.input_tps = s.input_tokens / s.measured_s;
    s.output_tps = s.output_tokens / s.measured_s;
    s.total_tps = s.input_tps + s.output_tps;
    s.request_rate = s.measured / s.measured_s;
  }
  s.cached_tokens = usage_cached;
  if (any_cached && usage_prompt > 0) s.usage_cached_rate = static_cast<double>(usage_cached) / usage_prompt;
  if (trace_in > 0) s.theoretical_hit_rate = static_cast<double>(hit_tokens) / trace_in;
  if (before.available && after.available) {
    s.server_hits = after.prefix_cache_hits - before.prefix_cache_hits;
    s.server_queries = after.prefix_cache_queries - before.prefix_cache_queries;
    if (s.server_queries > 0) s.server_hit_rate = s.server_hits / s.server_queries;
  }
  return s;
}

int64_t infinite_cache_hits(const std::vector<Block>& blocks, std::unordered_set<int64_t>& seen) {
  int64_t hits = 0;
  for (const Block& b : blocks) {
    if (!seen.insert(b.id).second) hits += b.tokens;
  }
  return hits;
}

double corpus_hit_rate(const std::vector<Session>& sessions) {
  int64_t hits = 0, total = 0;
  for (const Session& s : sessions) {
    std::vector<const TraceRequest*> requests = all_requests(s.main);
    std::stable_sort(requests.begin(), requests.end(),
                     [](const TraceRequest* a, const TraceRequest* b) { return a->t < b->t; });
    std::unordered_set<int64_t> seen;
    int64_t unique = 0;
    for (const TraceRequest* q : requests) {
      hits += infinite_cache_hits(request_blocks(*q, s.block_size, unique), seen);
      unique += 1 << 20;
      total += q->in;
    }
  }
  return total > 0 ? static_cast<double>(hits) / total : 0.0;
}

namespace {

json ms(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean * 1e3}, {"p50", d.p50 * 1e3}, {"p90", d.p90 * 1e3},
          {"p95", d.p95 * 1e3}, {"p99", d.p99 * 1e3}};
}

const char* status_name(RequestRecord::Status s) {
  switch (s) {
    case RequestRecord::Status::ok: return "ok";
    case RequestRecord::Status::failed: return "failed";
    case RequestRecord::Status::skipped: return "skipped";
  }
  return "?";
}

}  // namespace

json to_json(const RunSummary& s) {
  const double gpus = s.num_gpus;
  return {
      {"concurrency", s.concurrency},
      {"num_gpus", s.num_gpus},
      {"wall_s", s.wall_s},
      {"measured_s", s.measured_s},
      {"requests",
       {{"sent", s.sent}, {"completed", s.completed}, {"failed", s.failed}, {"skipped_over_context", s.skipped},
        {"warmup", s.warmup}, {"measured", s.measured}, {"with_server_usage", s.with_server_usage},
        {"replays", s.replays}, {"context_resets", s.context_resets}}},
      {"ttft_ms", ms(s.ttft_s)},
      {"itl_ms", ms(s.itl_s)},
      {"tpot_ms", ms(s.tpot_s)},
      {"e2el_ms", ms(s.e2el_s)},
      {"interactivity_tok_s_user", s.interactivity},
      {"tokens", {{"input", s.input_tokens}, {"output", s.output_tokens}, {"cached", s.cached_tokens}}},
      {"throughput",
       {{"input_tok_s", s.input_tps}, {"output_tok_s", s.output_tps}, {"total_tok_s", s.total_tps},
        {"input_tok_s_per_gpu", s.input_tps / gpus}, {"output_tok_s_per_gpu", s.output_tps / gpus},
        {"total_tok_s_per_gpu", s.total_tps / gpus}, {"requests_s", s.request_rate}}},
      {"prefix_cache",
       {{"server_hit_rate", s.server_hit_rate}, {"server_hits", s.server_hits}, {"server_queries", s.server_queries},
        {"usage_cached_rate", s.usage_cached_rate}, {"theoretical_hit_rate", s.theoretical_hit_rate}}},
      {"think",
       {{"max_wait_s", s.max_wait_s}, {"max_recorded_wait_s", s.max_recorded_wait_s},
        {"capped_waits", s.capped_waits}, {"skipped_idle_s", s.skipped_idle_s}}},
      {"errors", s.errors},
  };
}

json records_to_json(const RunResult& run) {
  json requests = json::array();
  for (const RequestRecord& r : run.requests) {
    requests.push_back({{"lane", r.lane}, {"replay", r.replay}, {"session", r.session}, {"agent", r.agent},
                        {"turn", r.turn}, {"warmup", r.warmup}, {"status", status_name(r.status)},
                        {"error", r.error}, {"start_s", r.start_s}, {"ttft_s", r.ttft_s}, {"e2e_s", r.e2e_s},
                        {"trace_in", r.trace_in}, {"trace_out", r.trace_out}, {"prompt_tokens", r.prompt_tokens},
                        {"completion_tokens", r.completion_tokens}, {"cached_tokens", r.cached_tokens},
                        {"server_usage", r.server_usage}, {"theoretical_hit_tokens", r.theoretical_hit_tokens},
                        {"recorded_wait_s", r.recorded_wait_s}, {"wait_s", r.wait_s}});
  }
  json replays = json::array();
  for (const ReplayRecord& p : run.replays) {
    replays.push_back({{"lane", p.lane}, {"replay", p.replay}, {"session", p.session}, {"marker", p.marker},
                       {"start_s", p.start_s}, {"end_s", p.end_s}});
  }
  return {{"requests", requests}, {"replays", replays}};
}

}  // namespace m3::loadgen
