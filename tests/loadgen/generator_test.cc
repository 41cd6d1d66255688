// The synthetic generator: the same seed gives the same corpus, another seed another one, and
// the distributions have the shape asked for (think-time median ~5 s with a mean far above it,
// growing contexts whose block ids extend the last request's, sub-agents).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "loadgen/report.h"
#include "loadgen/trace_generator.h"

namespace m3::loadgen {
namespace {

std::string dump(const std::vector<Session>& sessions) {
  std::string out;
  for (const Session& s : sessions) out += session_to_json(s).dump() + "\n";
  return out;
}

TEST(Generator, SeededAndDeterministic) {
  GeneratorOptions o;
  o.num_sessions = 8;
  o.seed = 42;
  EXPECT_EQ(dump(generate_traces(o)), dump(generate_traces(o)));
  GeneratorOptions other = o;
  other.seed = 43;
  EXPECT_NE(dump(generate_traces(o)), dump(generate_traces(other)));
}

TEST(Generator, DistributionsHaveThePublishedShape) {
  GeneratorOptions o;
  o.num_sessions = 200;
  o.seed = 1;
  const std::vector<Session> sessions = generate_traces(o);
  std::vector<double> main_think, outputs;
  int subagents = 0;
  for (const Session& s : sessions) {
    const TraceRequest* last = nullptr;
    for (const AgentStep& step : s.main.steps) {
      if (step.subagent) {
        ++subagents;
        continue;
      }
      const TraceRequest& q = *step.request;
      EXPECT_EQ(static_cast<int64_t>(q.hash_ids.size()), (q.in + 63) / 64);
      EXPECT_LE(q.in + q.out, o.max_context_tokens);
      outputs.push_back(static_cast<double>(q.out));
      if (last != nullptr) {
        main_think.push_back(*q.think_time);
        // The context grows, and keeps the last request's full blocks.
        EXPECT_GT(q.in, last->in);
        const size_t full = static_cast<size_t>(last->in / 64);
        EXPECT_TRUE(std::equal(last->hash_ids.begin(), last->hash_ids.begin() + full, q.hash_ids.begin()));
      }
      last = &q;
    }
  }
  const Distribution think = summarize(main_think);
  EXPECT_GT(think.p50, 3.0);
  EXPECT_LT(think.p50, 8.0);
  EXPECT_GT(think.mean, 10 * think.p50);  // heavy tail
  const Distribution out = summarize(outputs);
  EXPECT_GT(out.p50, 150);
  EXPECT_LT(out.p50, 260);
  EXPECT_GT(subagents, 20);
  // Turns keep their context: an infinite cache hits most input tokens (the corpus is ~98%).
  EXPECT_GT(corpus_hit_rate(sessions), 0.8);
}

TEST(Generator, SmallContextLimitStillGivesValidSessions) {
  GeneratorOptions o;
  o.num_sessions = 3;
  o.max_context_tokens = 100;  // below the system prompt
  for (const Session& s : generate_traces(o)) {
    ASSERT_FALSE(s.main.steps.empty());
    for (const TraceRequest* q : all_requests(s.main)) EXPECT_LE(q->in + q->out, 100);
  }
}

}  // namespace
}  // namespace m3::loadgen
