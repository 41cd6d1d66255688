// SSE framing split anywhere, the OpenAI chunk fields, the cache-bust markers and /metrics text.
#include <gtest/gtest.h>

#include <set>

#include "loadgen/chat_stream.h"
#include "loadgen/http_stream_client.h"
#include "loadgen/prometheus.h"
#include "loadgen/replay.h"

namespace m3::loadgen {
namespace {

TEST(Stream, SseEventsSurviveAnySplit) {
  const std::string bytes =
      "data: {\"a\":1}\n\n: a comment\n\ndata: {\"b\":2}\r\n\r\nevent: x\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    std::vector<std::string> events;
    SseParser p([&](const std::string& d) { events.push_back(d); });
    p.feed(bytes.data(), cut);
    p.feed(bytes.data() + cut, bytes.size() - cut);
    ASSERT_EQ(events, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"})) << cut;
  }
}

TEST(Stream, ChunkFields) {
  EXPECT_TRUE(parse_chunk("[DONE]").done);
  EXPECT_TRUE(parse_chunk(R"({"choices":[{"delta":{"content":"hi"}}]})").has_text);
  EXPECT_TRUE(parse_chunk(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})").has_text);
  EXPECT_TRUE(parse_chunk(R"({"choices":[{"text":"x"}]})").has_text);
  EXPECT_FALSE(parse_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})").has_text);
  const ChunkInfo u = parse_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":256}}})");
  EXPECT_TRUE(u.has_usage);
  EXPECT_EQ(u.prompt_tokens, 300);
  EXPECT_EQ(u.completion_tokens, 7);
  EXPECT_EQ(u.cached_tokens, 256);
  EXPECT_EQ(parse_chunk(R"({"usage":{"prompt_tokens":3,"completion_tokens":1}})").cached_tokens, -1);
  EXPECT_FALSE(parse_chunk(R"({"error":{"message":"bad"}})").error.empty());
  EXPECT_FALSE(parse_chunk("nope").error.empty());
}

TEST(Stream, MarkersDifferPerReplayAndRun) {
  std::set<std::string> seen;
  for (uint64_t run = 0; run < 3; ++run)
    for (int i = 0; i < 100; ++i) EXPECT_TRUE(seen.insert(cache_bust_marker(run, i)).second);
  EXPECT_EQ(cache_bust_marker(5, 3), cache_bust_marker(5, 3));
}

TEST(Stream, PrometheusCountersSumOverLabels) {
  const auto m = parse_prometheus_text(
      "# HELP vllm:prefix_cache_hits_total x\n# TYPE vllm:prefix_cache_hits_total counter\n"
      "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"a b}\"} 12.0\n"
      "vllm:prefix_cache_hits_total{engine=\"1\"} 30\n"
      "vllm:prompt_tokens 5e2\n");
  EXPECT_DOUBLE_EQ(metric_value(m, "vllm:prefix_cache_hits"), 42);
  EXPECT_DOUBLE_EQ(metric_value(m, "vllm:prompt_tokens"), 500);
  EXPECT_DOUBLE_EQ(metric_value(m, "vllm:generation_tokens"), 0);
}

TEST(Stream, EndpointParsing) {
  const Endpoint e = Endpoint::parse("http://127.0.0.1:8000/");
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, "8000");
  EXPECT_EQ(Endpoint::parse("http://server").port, "80");
  EXPECT_THROW(Endpoint::parse("https://server"), std::exception);
}

}  // namespace
}  // namespace m3::loadgen
