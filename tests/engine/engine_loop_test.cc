// The engine loop on a fake model whose logits depend on the whole context read back through
// the page table: outputs must equal an oracle computed from the tokens alone, whatever the
// batching, chunking, preemption or prefix caching.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <fmt/core.h>

#include "core/error.h"
#include "engine/engine_loop.h"
#include "fake_model.h"

namespace m3 {
namespace {

constexpr int kVocab = 97;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<PositionLogprobs> logprobs;
  std::optional<std::vector<PositionLogprobs>> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
  std::optional<int32_t> stop_token_id;
  int finished_calls = 0;
  int num_cached_prompt_tokens = -1;
  std::string error;
};

using Results = std::map<std::string, Collected>;

OutputSink collector(Results& results, const std::string& id) {
  return [&results, id](const RequestOutput& out) {
    Collected& c = results[id];
    EXPECT_EQ(c.finished_calls, 0) << id << ": output after the final one";
    EXPECT_EQ(out.request_id, id);
    c.tokens.insert(c.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    if (out.prompt_logprobs) {
      EXPECT_FALSE(c.prompt_logprobs.has_value()) << id << ": prompt logprobs twice";
      c.prompt_logprobs = out.prompt_logprobs;
    }
    if (out.finished) {
      ++c.finished_calls;
      c.reason = out.finish_reason;
      c.stop_token_id = out.stop_token_id;
      c.num_cached_prompt_tokens = out.num_cached_prompt_tokens;
      c.error = out.error;
      EXPECT_TRUE(out.timings.has_value());
    }
  };
}

EngineRequest make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f,
                           std::optional<uint64_t> seed = std::nullopt) {
  EngineRequest r;
  r.id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

std::vector<int32_t> pseudo_prompt(int len, uint64_t salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = static_cast<int32_t>(test::mix64(salt * 1000 + i) % kVocab);
  return p;
}

// Greedy continuation straight from the fake's definition, no engine involved.
std::vector<int32_t> oracle_greedy(std::vector<int32_t> context, int max_tokens) {
  std::vector<int32_t> out;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < max_tokens; ++i) {
    test::fake_logits(context, kVocab, logits.data());
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    context.push_back(next);
  }
  return out;
}

// Runs every request to completion. Request i is added before step i * stagger.
Results run(test::FakeModel& model, EngineConfig config, const std::vector<EngineRequest>& requests, int stagger = 0,
            EngineStats* stats_out = nullptr, EngineLoop* reuse = nullptr) {
  Results results;
  std::unique_ptr<EngineLoop> own;
  if (config.max_model_len == 0) config.max_model_len = 4096;
  if (!reuse) own = std::make_unique<EngineLoop>(model, config);
  EngineLoop& loop = reuse ? *reuse : *own;
  std::size_t next = 0;
  for (int step = 0; next < requests.size() || loop.has_work(); ++step) {
    while (next < requests.size() && (stagger == 0 || static_cast<int>(next) * stagger <= step)) {
      const EngineRequest& r = requests[next++];
      loop.add(r, collector(results, r.id), r.sampling.seed.value_or(0), Clock::now());
    }
    loop.step();
    loop.kv().pool().check_invariants();
  }
  EXPECT_EQ(loop.kv().pool().num_used(), 0) << "blocks leaked";
  if (stats_out) *stats_out = loop.stats();
  for (const EngineRequest& r : requests) EXPECT_EQ(results[r.id].finished_calls, 1) << r.id;
  return results;
}

std::vector<EngineRequest> mixed_requests(int n, float temperature) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    const int len = 1 + static_cast<int>(test::mix64(i) % 70);
    reqs.push_back(make_request(fmt::format("r{}", i), pseudo_prompt(len, i), 5 + i % 13, temperature, 1000 + i));
  }
  return reqs;
}

void expect_same_logprobs(const std::vector<PositionLogprobs>& a, const std::vector<PositionLogprobs>& b,
                          const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].token_id, b[i].token_id) << what << " " << i;
    EXPECT_EQ(a[i].logprob, b[i].logprob) << what << " " << i;
    EXPECT_EQ(a[i].rank, b[i].rank) << what << " " << i;
    ASSERT_EQ(a[i].top.size(), b[i].top.size()) << what << " " << i;
    for (std::size_t j = 0; j < a[i].top.size(); ++j) EXPECT_EQ(a[i].top[j].token_id, b[i].top[j].token_id);
  }
}

void expect_same_tokens(const Results& a, const Results& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, c] : a) {
    EXPECT_EQ(c.tokens, b.at(id).tokens) << id;
    EXPECT_EQ(c.reason, b.at(id).reason) << id;
    expect_same_logprobs(c.logprobs, b.at(id).logprobs, id + " logprobs");
    ASSERT_EQ(c.prompt_logprobs.has_value(), b.at(id).prompt_logprobs.has_value()) << id;
    if (c.prompt_logprobs) expect_same_logprobs(*c.prompt_logprobs, *b.at(id).prompt_logprobs, id + " prompt logprobs");
  }
}

TEST(EngineLoop, GreedyMatchesTheOracleAloneAndInABatchOf32) {
  const auto reqs = mixed_requests(32, 0.0f);
  Results alone;
  for (const EngineRequest& r : reqs) {
    test::FakeModel model(8, 64, kVocab);
    alone.merge(run(model, {}, {r}));
  }
  for (const EngineRequest& r : reqs) {
    EXPECT_EQ(alone[r.id].tokens, oracle_greedy(r.prompt_token_ids, r.sampling.max_tokens)) << r.id;
    EXPECT_EQ(alone[r.id].reason, FinishReason::kLength);
  }
  test::FakeModel model(8, 1024, kVocab);
  EngineConfig config;
  config.max_num_seqs = 32;
  config.max_num_batched_tokens = 64;
  const Results batched = run(model, config, reqs, /*stagger=*/1);
  expect_same_tokens(alone, batched);
  EXPECT_LE(model.max_step_tokens, 64);
}

TEST(EngineLoop, OutputsSurvivePreemptionUnchanged) {
  for (float temperature : {0.0f, 0.9f}) {
    auto reqs = mixed_requests(24, temperature);
    for (int i = 0; i < 24; i += 3) {  // logprobs and prompt logprobs must survive recompute too
      reqs[i].sampling.logprobs = 2;
      reqs[i].sampling.prompt_logprobs = 1;
    }
    test::FakeModel big(8, 1024, kVocab);
    const Results reference = run(big, {}, reqs);
    test::FakeModel tiny(8, 14, kVocab);  // 112 tokens of KV for 24 requests: constant preemption
    EngineConfig config;
    config.max_num_seqs = 16;
    config.max_num_batched_tokens = 48;
    config.max_model_len = 112;
    EngineStats stats;
    const Results squeezed = run(tiny, config, reqs, 0, &stats);
    EXPECT_GT(stats.num_preemptions, 5u) << "the pool was meant to force preemption";
    expect_same_tokens(reference, squeezed);
  }
}

TEST(EngineLoop, PrefixCacheHitsGiveIdenticalOutputs) {
  // Multi-turn style: every request extends a shared 40-token system prompt.
  const auto system = pseudo_prompt(40, 77);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    auto prompt = system;
    const auto tail = pseudo_prompt(3 + i * 5, 500 + i);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    reqs.push_back(make_request(fmt::format("p{}", i), prompt, 6, i % 2 ? 0.7f : 0.0f, 5 + i));
  }
  test::FakeModel cold_model(8, 512, kVocab);
  EngineConfig no_cache;
  no_cache.enable_prefix_caching = false;
  const Results cold = run(cold_model, no_cache, reqs);

  test::FakeModel warm_model(8, 512, kVocab);
  EngineConfig config;
  config.max_model_len = 4096;
  EngineLoop loop(warm_model, config);
  const Results first = run(warm_model, config, {reqs[0]}, 0, nullptr, &loop);
  EngineStats stats;
  const Results rest = run(warm_model, config, reqs, 0, &stats, &loop);  // r0 again: cached too
  expect_same_tokens(cold, rest);
  EXPECT_EQ(first.at("p0").tokens, cold.at("p0").tokens);
  for (const auto& [id, c] : rest) EXPECT_GE(c.num_cached_prompt_tokens, 40) << id;
  EXPECT_EQ(stats.prefix_cache_hits_tokens, 12u * 40u);  // the tails are unique
  EXPECT_LT(warm_model.total_tokens, cold_model.total_tokens);
}

TEST(EngineLoop, SeededSamplingIsReproducibleAcrossBatchCompositions) {
  auto reqs = mixed_requests(16, 1.0f);
  for (auto& r : reqs) r.sampling.top_k = 20;
  test::FakeModel m1(8, 1024, kVocab), m2(8, 1024, kVocab);
  const Results a = run(m1, {}, reqs);
  EngineConfig small;
  small.max_num_seqs = 3;
  small.max_num_batched_tokens = 7;
  const Results b = run(m2, small, reqs, 2);
  expect_same_tokens(a, b);
  // A different seed changes the output of at least one request.
  auto reseeded = reqs;
  for (auto& r : reseeded) r.sampling.seed = *r.sampling.seed + 1;
  test::FakeModel m3(8, 1024, kVocab);
  const Results c = run(m3, {}, reseeded);
  int differing = 0;
  for (const auto& [id, col] : a) differing += col.tokens != c.at(id).tokens;
  EXPECT_GT(differing, 0);
}

TEST(EngineLoop, StopTokensEosIgnoreEosMinTokensAndLength) {
  const auto prompt = pseudo_prompt(10, 3);
  const auto greedy = oracle_greedy(prompt, 8);
  test::FakeModel model(8, 64, kVocab);

  auto eos = make_request("eos", prompt, 8);
  eos.eos_token_ids = {greedy[2]};
  auto stop = make_request("stop", prompt, 8);
  stop.sampling.stop_token_ids = {greedy[3]};
  auto ignore = make_request("ignore", prompt, 8);
  ignore.eos_token_ids = {greedy[2]};
  ignore.sampling.ignore_eos = true;
  auto min_tokens = make_request("min", prompt, 8);
  min_tokens.eos_token_ids = {greedy[0]};
  min_tokens.sampling.min_tokens = 1;
  const Results r = run(model, {}, {eos, stop, ignore, min_tokens});

  EXPECT_EQ(r.at("eos").tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + 3));
  EXPECT_EQ(r.at("eos").reason, FinishReason::kStop);
  EXPECT_EQ(r.at("eos").stop_token_id, greedy[2]);
  EXPECT_EQ(r.at("stop").tokens.back(), greedy[3]);
  EXPECT_EQ(r.at("stop").reason, FinishReason::kStop);
  EXPECT_EQ(r.at("ignore").tokens, greedy);
  EXPECT_EQ(r.at("ignore").reason, FinishReason::kLength);
  // min_tokens masks eos at the first step, so the first token differs from the unmasked argmax.
  EXPECT_NE(r.at("min").tokens[0], greedy[0]);
  EXPECT_FALSE(r.at("min").stop_token_id.has_value() && r.at("min").tokens.size() == 1);
}

TEST(EngineLoop, LogprobsAndPromptLogprobsMatchTheRawLogits) {
  const auto prompt = pseudo_prompt(30, 9);
  auto req = make_request("lp", prompt, 4);
  req.sampling.logprobs = 3;
  req.sampling.prompt_logprobs = 2;
  auto prompt_only = make_request("po", prompt, 0);
  prompt_only.sampling.prompt_logprobs = 0;
  test::FakeModel model(8, 64, kVocab);
  EngineConfig config;
  config.max_num_batched_tokens = 11;  // prompt logprobs collected over several chunks
  const Results r = run(model, config, {req, prompt_only});

  std::vector<float> logits(kVocab);
  auto expected_logprob = [&](const std::vector<int32_t>& context, int32_t token) {
    test::fake_logits(context, kVocab, logits.data());
    double z = 0.0;
    for (float x : logits) z += std::exp(static_cast<double>(x));
    return logits[token] - std::log(z);
  };
  const Collected& c = r.at("lp");
  ASSERT_TRUE(c.prompt_logprobs.has_value());
  ASSERT_EQ(c.prompt_logprobs->size(), prompt.size() - 1);
  for (std::size_t i = 0; i + 1 < prompt.size(); ++i) {
    const std::vector<int32_t> context(prompt.begin(), prompt.begin() + i + 1);
    const PositionLogprobs& lp = (*c.prompt_logprobs)[i];
    EXPECT_EQ(lp.token_id, prompt[i + 1]);
    EXPECT_NEAR(lp.logprob, expected_logprob(context, prompt[i + 1]), 1e-5) << i;
    EXPECT_EQ(lp.top.size(), 2u);
  }
  ASSERT_EQ(c.logprobs.size(), 4u);
  std::vector<int32_t> context = prompt;
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.logprobs[i].token_id, c.tokens[i]);
    EXPECT_EQ(c.logprobs[i].rank, 1);  // greedy picks the top token
    EXPECT_EQ(c.logprobs[i].top.size(), 3u);
    EXPECT_EQ(c.logprobs[i].top[0].token_id, c.tokens[i]);
    EXPECT_NEAR(c.logprobs[i].logprob, expected_logprob(context, c.tokens[i]), 1e-5);
    context.push_back(c.tokens[i]);
  }
  const Collected& po = r.at("po");
  EXPECT_TRUE(po.tokens.empty());
  EXPECT_EQ(po.reason, FinishReason::kLength);
  ASSERT_TRUE(po.prompt_logprobs.has_value());
  EXPECT_EQ(po.prompt_logprobs->size(), prompt.size() - 1);
  for (std::size_t i = 0; i < po.prompt_logprobs->size(); ++i) {
    EXPECT_EQ((*po.prompt_logprobs)[i].logprob, (*c.prompt_logprobs)[i].logprob);
  }
}

TEST(EngineLoop, AbortFreesBlocksAtOnceAndSendsAFinalOutput) {
  test::FakeModel model(8, 64, kVocab);
  EngineConfig config;
  config.max_model_len = 512;
  config.max_num_batched_tokens = 16;
  EngineLoop loop(model, config);
  Results results;
  loop.add(make_request("a", pseudo_prompt(100, 1), 50), collector(results, "a"), 0, Clock::now());
  loop.add(make_request("b", pseudo_prompt(20, 2), 50), collector(results, "b"), 0, Clock::now());
  loop.step();  // a is mid-prefill, b waits for budget
  EXPECT_GT(loop.kv().pool().num_used(), 0);
  EXPECT_TRUE(loop.abort("a"));
  EXPECT_TRUE(loop.abort("b"));
  EXPECT_FALSE(loop.abort("a"));
  EXPECT_FALSE(loop.abort("unknown"));
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  EXPECT_FALSE(loop.has_work());
  EXPECT_EQ(results["a"].reason, FinishReason::kAbort);
  EXPECT_EQ(results["a"].finished_calls, 1);
  EXPECT_EQ(results["b"].reason, FinishReason::kAbort);
  EXPECT_EQ(loop.stats().finished_abort, 2u);
}

TEST(EngineLoop, AModelErrorFailsThatStepsRequestsAndTheEngineGoesOn) {
  test::FakeModel model(8, 64, kVocab);
  EngineConfig config;
  config.max_model_len = 512;
  EngineLoop loop(model, config);
  Results results;
  bool fail_next = true;
  model.before_forward = [&](const StepBatch&) {
    if (fail_next) {
      fail_next = false;
      fail("fake: device on fire");
    }
  };
  loop.add(make_request("x", pseudo_prompt(5, 1), 3), collector(results, "x"), 0, Clock::now());
  loop.step();
  EXPECT_EQ(results["x"].reason, FinishReason::kError);
  EXPECT_NE(results["x"].error.find("device on fire"), std::string::npos);
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  const auto prompt = pseudo_prompt(5, 2);
  loop.add(make_request("y", prompt, 3), collector(results, "y"), 0, Clock::now());
  while (loop.has_work()) loop.step();
  EXPECT_EQ(results["y"].tokens, oracle_greedy(prompt, 3));
  EXPECT_EQ(loop.stats().finished_error, 1u);
}

TEST(EngineLoop, AThrowingSinkDropsOnlyItsRequest) {
  test::FakeModel model(8, 64, kVocab);
  EngineConfig config;
  config.max_model_len = 512;
  EngineLoop loop(model, config);
  Results results;
  loop.add(make_request("bad", pseudo_prompt(5, 1), 10), [](const RequestOutput&) { throw std::runtime_error("gone"); },
           0, Clock::now());
  const auto prompt = pseudo_prompt(7, 3);
  loop.add(make_request("good", prompt, 4), collector(results, "good"), 0, Clock::now());
  while (loop.has_work()) loop.step();
  EXPECT_EQ(results["good"].tokens, oracle_greedy(prompt, 4));
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
}

// Random arrivals, aborts, shared prefixes, pools small enough to preempt, odd budgets: every
// request that completes must equal the oracle, aborted ones must be a prefix of it, and the
// pool's bookkeeping must hold after every step.
TEST(EngineLoop, RandomisedSchedulesNeverCorruptOutputs) {
  uint64_t total_preemptions = 0, total_hits = 0;
  for (uint64_t scenario = 0; scenario < 150; ++scenario) {
    uint64_t rng = scenario * 0x9e3779b97f4a7c15ull + 1;
    auto next = [&](uint64_t bound) { return (rng = test::mix64(rng)) % bound; };
    const int block_size = 1 + static_cast<int>(next(8));
    const int num_blocks = 24 + static_cast<int>(next(40));
    test::FakeModel model(block_size, num_blocks, kVocab);
    EngineConfig config;
    config.max_num_seqs = 1 + static_cast<int>(next(12));
    config.max_num_batched_tokens = config.max_num_seqs + static_cast<int>(next(40));
    config.max_model_len = num_blocks * block_size;
    config.enable_prefix_caching = next(4) != 0;
    EngineLoop loop(model, config);
    Results results;
    std::map<std::string, EngineRequest> requests;
    const auto shared = pseudo_prompt(30, 1000 + scenario);
    const int num_requests = 10 + static_cast<int>(next(20));
    int added = 0;
    for (int step = 0; added < num_requests || loop.has_work(); ++step) {
      if (added < num_requests && next(3) == 0) {
        EngineRequest r;
        r.id = fmt::format("s{}", added++);
        if (next(2)) r.prompt_token_ids.assign(shared.begin(), shared.begin() + 1 + next(shared.size()));
        const auto tail = pseudo_prompt(static_cast<int>(next(40)), scenario * 100 + added);
        r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
        if (r.prompt_token_ids.empty()) r.prompt_token_ids.push_back(5);
        const int room = config.max_model_len - static_cast<int>(r.prompt_token_ids.size());
        if (room < 1) continue;
        r.sampling.max_tokens = 1 + static_cast<int>(next(std::min(room, 25)));
        r.sampling.temperature = 0.0f;
        if (next(5) == 0) r.sampling.logprobs = 1;
        if (next(7) == 0) r.sampling.prompt_logprobs = 0;
        requests[r.id] = r;
        loop.add(r, collector(results, r.id), 0, Clock::now());
      }
      if (added > 0 && next(9) == 0) loop.abort(fmt::format("s{}", next(added)));
      loop.step();
      loop.kv().pool().check_invariants();
    }
    ASSERT_EQ(loop.kv().pool().num_used(), 0) << "scenario " << scenario;
    for (const auto& [id, r] : requests) {
      const Collected& c = results[id];
      ASSERT_EQ(c.finished_calls, 1) << "scenario " << scenario << " " << id;
      ASSERT_TRUE(c.error.empty()) << "scenario " << scenario << " " << id << ": " << c.error;
      const auto expected = oracle_greedy(r.prompt_token_ids, r.sampling.max_tokens);
      if (c.reason == FinishReason::kLength) {
        ASSERT_EQ(c.tokens, expected) << "scenario " << scenario << " " << id;
      } else {
        ASSERT_EQ(c.reason, FinishReason::kAbort) << "scenario " << scenario << " " << id;
        ASSERT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), expected.begin())) << "scenario " << scenario;
      }
      if (r.sampling.prompt_logprobs >= 0 && c.reason == FinishReason::kLength) {
        ASSERT_TRUE(c.prompt_logprobs.has_value()) << "scenario " << scenario << " " << id;
        ASSERT_EQ(c.prompt_logprobs->size(), r.prompt_token_ids.size() - 1) << "scenario " << scenario << " " << id;
      }
    }
    total_preemptions += loop.stats().num_preemptions;
    total_hits += loop.stats().prefix_cache_hits_tokens;
  }
  EXPECT_GT(total_preemptions, 100u);  // the scenarios do exercise preemption
  EXPECT_GT(total_hits, 1000u);        // and prefix caching
}

TEST(EngineLoop, StatsCountTokensAndRequests) {
  test::FakeModel model(8, 64, kVocab);
  EngineStats stats;
  run(model, {}, {make_request("a", pseudo_prompt(9, 1), 4), make_request("b", pseudo_prompt(3, 2), 2)}, 0, &stats);
  EXPECT_EQ(stats.prompt_tokens_total, 12u);
  EXPECT_EQ(stats.generation_tokens_total, 6u);
  EXPECT_EQ(stats.finished_length, 2u);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_usage, 0.0);
  EXPECT_EQ(stats.prefix_cache_queries_tokens, 12u);
}

}  // namespace
}  // namespace m3
