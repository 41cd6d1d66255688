#include "server/metrics.h"

#include <gtest/gtest.h>

namespace m3::server {
namespace {

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(Metrics, RendersVllmNamesWithLabels) {
  ServerMetrics metrics("tiny \"model\"");
  EngineStats stats;
  stats.num_running = 3;
  stats.num_waiting = 1;
  stats.kv_usage = 0.25;
  stats.prompt_tokens_total = 120;
  stats.generation_tokens_total = 45;
  stats.prefix_cache_queries_tokens = 256;
  stats.prefix_cache_hits_tokens = 128;
  stats.num_preemptions = 2;
  metrics.count_finished(FinishedReason::kStop);
  metrics.count_finished(FinishedReason::kStop);
  metrics.count_finished(FinishedReason::kLength);
  metrics.observe_time_to_first_token(0.03);
  metrics.observe_time_to_first_token(3.0);
  metrics.observe_inter_token_latency(0.02);

  std::string text = metrics.render(stats);
  const std::string l = "engine=\"0\",model_name=\"tiny \\\"model\\\"\"";
  EXPECT_TRUE(contains(text, "# TYPE vllm:num_requests_running gauge\n"));
  EXPECT_TRUE(contains(text, "vllm:num_requests_running{" + l + "} 3.0\n"));
  EXPECT_TRUE(contains(text, "vllm:num_requests_waiting{" + l + "} 1.0\n"));
  EXPECT_TRUE(contains(text, "vllm:kv_cache_usage_perc{" + l + "} 0.25\n"));
  EXPECT_TRUE(contains(text, "vllm:prompt_tokens_total{" + l + "} 120.0\n"));
  EXPECT_TRUE(contains(text, "vllm:generation_tokens_total{" + l + "} 45.0\n"));
  EXPECT_TRUE(contains(text, "vllm:prefix_cache_queries_total{" + l + "} 256.0\n"));
  EXPECT_TRUE(contains(text, "vllm:prefix_cache_hits_total{" + l + "} 128.0\n"));
  EXPECT_TRUE(contains(text, "vllm:num_preemptions_total{" + l + "} 2.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:request_success_total{" + l + ",finished_reason=\"stop\"} 2.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:request_success_total{" + l + ",finished_reason=\"length\"} 1.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:request_success_total{" + l + ",finished_reason=\"abort\"} 0.0\n"));
  EXPECT_FALSE(contains(text, "vllm:spec_decode"));  // no speculative decoding, no counters
  EngineStats spec = stats;
  spec.spec_num_drafts = 10;
  spec.spec_num_draft_tokens = 30;
  spec.spec_num_accepted_tokens = 17;
  spec.spec_accepted_per_pos = {9, 6, 2};
  const std::string spec_text = metrics.render(spec);
  EXPECT_TRUE(contains(spec_text, "# TYPE vllm:spec_decode_num_drafts_total counter\n"));
  EXPECT_TRUE(contains(spec_text, "vllm:spec_decode_num_drafts_total{" + l + "} 10.0\n"));
  EXPECT_TRUE(contains(spec_text, "vllm:spec_decode_num_draft_tokens_total{" + l + "} 30.0\n"));
  EXPECT_TRUE(contains(spec_text, "vllm:spec_decode_num_accepted_tokens_total{" + l + "} 17.0\n"));
  EXPECT_TRUE(contains(spec_text, "vllm:spec_decode_num_accepted_tokens_per_pos_total{" + l + ",position=\"2\"} 2.0\n"));
  EXPECT_FALSE(contains(spec_text, "m3:spec_decode"));  // adaptive verification off: none of its series
  spec.spec_adaptive_verification = true;
  spec.spec_num_unverified_draft_tokens = 12;
  spec.spec_verify_threshold = 0.25;
  const std::string adaptive_text = metrics.render(spec);
  EXPECT_TRUE(contains(adaptive_text, "m3:spec_decode_num_unverified_draft_tokens_total{" + l + "} 12.0\n"));
  EXPECT_TRUE(contains(adaptive_text, "# TYPE m3:spec_decode_verify_threshold gauge\n"));
  EXPECT_TRUE(contains(adaptive_text, "m3:spec_decode_verify_threshold{" + l + "} 0.25\n"));
  // Cumulative buckets: 0.03 falls in le=0.04, 3.0 in le=5.0.
  EXPECT_TRUE(
      contains(text, "vllm:time_to_first_token_seconds_bucket{" + l + ",le=\"0.02\"} 0.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:time_to_first_token_seconds_bucket{" + l + ",le=\"0.04\"} 1.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:time_to_first_token_seconds_bucket{" + l + ",le=\"2.5\"} 1.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:time_to_first_token_seconds_bucket{" + l + ",le=\"5.0\"} 2.0\n"));
  EXPECT_TRUE(
      contains(text, "vllm:time_to_first_token_seconds_bucket{" + l + ",le=\"+Inf\"} 2.0\n"));
  EXPECT_TRUE(contains(text, "vllm:time_to_first_token_seconds_count{" + l + "} 2.0\n"));
  EXPECT_TRUE(contains(text, "vllm:time_to_first_token_seconds_sum{" + l + "} 3.03\n"));
  EXPECT_TRUE(contains(text, "vllm:inter_token_latency_seconds_count{" + l + "} 1.0\n"));
  // Every non-comment line is "name{labels} value", with vLLM's names or m3serve's own.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("#", 0) == 0) continue;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
    EXPECT_TRUE(line.rfind("vllm:", 0) == 0 || line.rfind("m3:", 0) == 0) << line;
  }
}

TEST(Metrics, RequestPhasesIterationTokensAndCacheConfig) {
  ServerMetrics metrics("m");
  const std::string l = "engine=\"0\",model_name=\"m\"";
  RequestTimings t;
  t.prefill_s = 0.4;
  t.decode_s = 1.2;
  t.inference_s = 1.6;
  metrics.observe_request_phases(t, 5);  // mean time per output token 1.2 / 4
  metrics.observe_request_phases(t, 0);  // no token: nothing observed
  metrics.observe_inter_token_latency(0.02);
  EngineStats stats;
  stats.iteration_tokens_counts[0] = 4;  // four decode steps of 1 token
  stats.iteration_tokens_counts[3] = 1;  // a prompt step of 17..32
  stats.iteration_tokens_sum = 24;
  const CacheConfigInfo cache{128, "nvfp4", true, 0.85, 321};
  const std::string text = metrics.render(stats, &cache);
  for (const std::string& want : std::vector<std::string>{
           "vllm:request_prefill_time_seconds_bucket{" + l + ",le=\"0.3\"} 0.0\n",
           "vllm:request_prefill_time_seconds_bucket{" + l + ",le=\"0.5\"} 1.0\n",
           "vllm:request_prefill_time_seconds_count{" + l + "} 1.0\n",
           "vllm:request_decode_time_seconds_bucket{" + l + ",le=\"1.5\"} 1.0\n",
           "vllm:request_inference_time_seconds_sum{" + l + "} 1.6\n",
           "vllm:request_time_per_output_token_seconds_bucket{" + l + ",le=\"0.3\"} 1.0\n",
           "vllm:request_time_per_output_token_seconds_bucket{" + l + ",le=\"0.2\"} 0.0\n",
           "vllm:time_per_output_token_seconds_count{" + l + "} 1.0\n",
           "# TYPE vllm:iteration_tokens_total histogram\n",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"1.0\"} 4.0\n",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"16.0\"} 4.0\n",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"32.0\"} 5.0\n",
           "vllm:iteration_tokens_total_bucket{" + l + ",le=\"+Inf\"} 5.0\n",
           "vllm:iteration_tokens_total_sum{" + l + "} 24.0\n",
           "vllm:iteration_tokens_total_count{" + l + "} 5.0\n",
           "# TYPE vllm:cache_config_info gauge\n",
           "vllm:cache_config_info{block_size=\"128\",cache_dtype=\"nvfp4\",enable_prefix_caching=\"True\","
           "engine=\"0\",gpu_memory_utilization=\"0.85\",num_gpu_blocks=\"321\"} 1.0\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  EXPECT_EQ(metrics.render(stats).find("vllm:cache_config_info"), std::string::npos);  // no model yet
}

TEST(Metrics, TokenToSocketIsASummaryOfRecentSamples) {
  ServerMetrics metrics("m");
  for (int i = 1; i <= 100; ++i) metrics.observe_token_to_socket(i * 1e-6);
  EXPECT_EQ(metrics.token_to_socket().count(), 100u);
  EXPECT_NEAR(metrics.token_to_socket().quantile(0.5), 50.5e-6, 1e-6);
  EXPECT_NEAR(metrics.token_to_socket().quantile(0.99), 99e-6, 1.1e-6);
  const std::string text = metrics.render(EngineStats{});
  EXPECT_NE(text.find("# TYPE m3:token_to_socket_seconds summary\n"), std::string::npos);
  EXPECT_NE(text.find("m3:token_to_socket_seconds_count{engine=\"0\",model_name=\"m\"} 100.0\n"),
            std::string::npos)
      << text;
  // The window keeps the most recent samples only.
  for (size_t i = 0; i < LatencySummary::kWindow; ++i) metrics.observe_token_to_socket(1.0);
  EXPECT_EQ(metrics.token_to_socket().quantile(0.0), 1.0);
}

}  // namespace
}  // namespace m3::server
