// The report on hand-made records with answers worked out by hand: percentiles, TPOT, the
// E2E-normalised interactivity, throughput per GPU (cache hits counted as input), hit rates
// and the request accounting.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loadgen/report.h"

namespace m3::loadgen {
namespace {

TEST(Report, PercentilesInterpolateBetweenRanks) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 0.9), 3.7);
  EXPECT_DOUBLE_EQ(percentile({5}, 0.99), 5);
  EXPECT_DOUBLE_EQ(percentile({}, 0.5), 0);
  const Distribution d = summarize({10, 20, 30, 40, 50});
  EXPECT_DOUBLE_EQ(d.mean, 30);
  EXPECT_DOUBLE_EQ(d.p50, 30);
  EXPECT_DOUBLE_EQ(d.p90, 46);
  EXPECT_DOUBLE_EQ(d.p99, 49.6);
}

RequestRecord ok(double start, double ttft, double e2e, int64_t in, int64_t out, int64_t cached, int64_t hit) {
  RequestRecord r;
  r.start_s = start;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.prompt_tokens = in;
  r.trace_in = in;
  r.completion_tokens = out;
  r.cached_tokens = cached;
  r.server_usage = true;
  r.theoretical_hit_tokens = hit;
  return r;
}

TEST(Report, HandMadeRunGivesTheWorkedOutNumbers) {
  RunResult run;
  run.concurrency = 2;
  run.wall_s = 12;
  // Four measured requests over [0, 10] s.
  run.requests.push_back(ok(0.0, 0.5, 2.5, 1000, 5, 0, 0));       // E2E/OSL 0.5, TPOT 0.5
  run.requests.push_back(ok(1.0, 1.0, 5.0, 2000, 9, 1000, 1000));  // 0.555.., TPOT 0.5
  run.requests.push_back(ok(4.0, 0.2, 6.0, 3000, 30, 2000, 2500)); // 0.2, TPOT 0.2
  run.requests.push_back(ok(8.0, 0.1, 2.0, 4000, 20, 3000, 3500)); // 0.1, TPOT 0.1
  run.requests[0].itl_s = {0.5, 0.5};
  RequestRecord warm = ok(0.0, 9, 9, 100000, 1000, 0, 0);
  warm.warmup = true;
  run.requests.push_back(warm);
  RequestRecord failed;
  failed.status = RequestRecord::Status::failed;
  failed.error = "HTTP 500: boom";
  run.requests.push_back(failed);
  RequestRecord skipped;
  skipped.status = RequestRecord::Status::skipped;
  skipped.recorded_wait_s = 100;
  skipped.wait_s = 10;
  run.requests.push_back(skipped);
  ServerCounters before{true, 100, 1000, 0, 0}, after{true, 4100, 11000, 0, 0};

  const RunSummary s = summarize_run(run, before, after, 4, 10);
  EXPECT_EQ(s.sent, 6);
  EXPECT_EQ(s.completed, 5);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.sent, s.completed + s.failed);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.warmup, 1);
  EXPECT_EQ(s.measured, 4);
  EXPECT_EQ(s.errors, std::vector<std::string>{"HTTP 500: boom"});
  EXPECT_DOUBLE_EQ(s.measured_s, 10.0);  // 0 .. 8 + 2
  EXPECT_EQ(s.input_tokens, 10000);
  EXPECT_EQ(s.output_tokens, 64);
  EXPECT_DOUBLE_EQ(s.input_tps, 1000);
  EXPECT_DOUBLE_EQ(s.output_tps, 6.4);
  EXPECT_DOUBLE_EQ(s.total_tps, 1006.4);
  EXPECT_DOUBLE_EQ(to_json(s)["throughput"]["total_tok_s_per_gpu"].get<double>(), 251.6);
  // E2E/OSL = {0.5, 5/9, 0.2, 0.1}: p90 = 0.5 + 0.7 (5/9 - 0.5), interactivity its inverse.
  const double p90 = 0.5 + 0.7 * (5.0 / 9.0 - 0.5);
  EXPECT_NEAR(s.interactivity, 1.0 / p90, 1e-12);
  EXPECT_DOUBLE_EQ(s.tpot_s.p50, 0.35);
  EXPECT_DOUBLE_EQ(s.ttft_s.mean, (0.5 + 1.0 + 0.2 + 0.1) / 4);
  EXPECT_EQ(s.itl_s.count, 2);
  EXPECT_DOUBLE_EQ(s.usage_cached_rate, 6000.0 / 10000);
  EXPECT_DOUBLE_EQ(s.theoretical_hit_rate, 7000.0 / 10000);
  EXPECT_DOUBLE_EQ(s.server_hit_rate, 4000.0 / 10000);
  EXPECT_EQ(s.capped_waits, 1);
  EXPECT_DOUBLE_EQ(s.max_wait_s, 10);
  const nlohmann::json j = to_json(s);
  for (const char* key : {"requests", "ttft_ms", "itl_ms", "tpot_ms", "e2el_ms", "interactivity_tok_s_user",
                          "throughput", "prefix_cache", "tokens", "think"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["p50"].get<double>(), 350);
}

TEST(Report, TheoreticalHitRateOfACorpus) {
  Session s;
  s.id = "s";
  auto request = [](double t, int64_t in, std::vector<int64_t> ids) {
    TraceRequest q;
    q.t = t;
    q.in = in;
    q.out = 1;
    q.hash_ids = std::move(ids);
    return AgentStep{q, nullptr};
  };
  // 128 new, then 128 of 192 seen, then 192 of 200 seen (one sub-agent sharing the first block).
  s.main.steps.push_back(request(0, 128, {1, 2}));
  s.main.steps.push_back(request(5, 192, {1, 2, 3}));
  auto sub = std::make_shared<Agent>();
  sub->steps.push_back(request(2, 100, {1, 7}));
  s.main.steps.push_back(AgentStep{std::nullopt, sub});
  s.main.steps.push_back(request(9, 200, {1, 2, 3, 4}));
  // Time order: t=0 (0 hit), t=2 sub (64), t=5 (128), t=9 (192): 384 / 620.
  EXPECT_DOUBLE_EQ(corpus_hit_rate({s}), 384.0 / 620.0);
  std::unordered_set<int64_t> seen;
  EXPECT_EQ(infinite_cache_hits({{1, 64}, {1, 64}, {2, 5}}, seen), 64);
}

}  // namespace
}  // namespace m3::loadgen
