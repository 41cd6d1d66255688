// EngineCore: validation at the API boundary, the engine thread, concurrent clients, aborts and
// shutdown, on the fake model (fake_model.h).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/core.h>

#include "core/error.h"
#include "engine/engine_core.h"
#include "fake_model.h"

namespace m3 {
namespace {

constexpr int kVocab = 61;

std::vector<int32_t> prompt_of(int len, uint64_t salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = static_cast<int32_t>(test::mix64(salt * 7919 + i) % kVocab);
  return p;
}

std::vector<int32_t> oracle_greedy(std::vector<int32_t> context, int n) {
  std::vector<int32_t> out;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < n; ++i) {
    test::fake_logits(context, kVocab, logits.data());
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    context.push_back(out.back());
  }
  return out;
}

EngineRequest request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

// Collects one request's stream; wait() blocks until the final output.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int finals = 0;
  int outputs_after_final = 0;

  OutputSink sink() {
    return [this](const RequestOutput& out) {
      std::lock_guard lock(mu);
      if (finals > 0) ++outputs_after_final;
      tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) {
        reason = out.finish_reason;
        ++finals;
        cv.notify_all();
      }
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return finals > 0; });
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EngineCore, ResolvesMaxModelLenAndRejectsImpossibleConfigs) {
  {
    EngineCore engine(std::make_unique<test::FakeModel>(16, 10, kVocab, 1000), {});
    EXPECT_EQ(engine.max_model_len(), 160);  // the KV pool is the limit
    EXPECT_EQ(engine.kv_capacity_tokens(), 160);
    EXPECT_EQ(engine.block_size(), 16);
    EXPECT_EQ(engine.vocab_size(), kVocab);
  }
  {
    EngineCore engine(std::make_unique<test::FakeModel>(16, 100, kVocab, 1000), {});
    EXPECT_EQ(engine.max_model_len(), 1000);  // the model is the limit
  }
  EngineConfig too_long;
  too_long.max_model_len = 161;
  EXPECT_NE(error_of([&] { EngineCore e(std::make_unique<test::FakeModel>(16, 10, kVocab), too_long); })
                .find("does not fit the KV cache"),
            std::string::npos);
  EngineConfig starving;
  starving.max_num_seqs = 64;
  starving.max_num_batched_tokens = 32;
  EXPECT_NE(error_of([&] { EngineCore e(std::make_unique<test::FakeModel>(16, 10, kVocab), starving); })
                .find("greater than or equal to max_num_seqs"),
            std::string::npos);
  EngineConfig bad_budget;
  bad_budget.max_num_batched_tokens = 0;
  EXPECT_NE(error_of([&] { EngineCore e(std::make_unique<test::FakeModel>(16, 10, kVocab), bad_budget); })
                .find("max_num_batched_tokens"),
            std::string::npos);
}

TEST(EngineCore, WithoutChunkedPrefillTheBudgetMustCoverMaxModelLen) {
  EngineConfig config;
  config.enable_chunked_prefill = false;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 100;
  config.max_model_len = 101;
  EXPECT_NE(error_of([&] { EngineCore e(std::make_unique<test::FakeModel>(16, 10, kVocab), config); })
                .find("max_num_batched_tokens (100) is smaller than max_model_len (101) with chunked prefill disabled"),
            std::string::npos);
  config.max_model_len = 100;
  auto model = std::make_unique<test::FakeModel>(16, 10, kVocab);
  test::FakeModel& fake = *model;
  EngineCore engine(std::move(model), config);
  engine.start();
  const std::vector<int32_t> prompt = prompt_of(90, 5);
  Stream s;
  engine.add_request(request("whole", prompt, 3), s.sink());
  s.wait();
  EXPECT_EQ(s.tokens, oracle_greedy(prompt, 3));
  EXPECT_EQ(fake.max_step_tokens, 90);  // the prompt in one step
}

// --seed: requests without a seed draw theirs from the engine's generator, in request order.
std::vector<std::vector<int32_t>> sample_unseeded(uint64_t engine_seed, std::optional<uint64_t> last_seed = {}) {
  EngineConfig config;
  config.seed = engine_seed;
  EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), config);
  engine.start();
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r = request(fmt::format("r{}", i), prompt_of(6, 11), 12);
    r.sampling.temperature = 1.0f;
    if (i == 2) r.sampling.seed = last_seed;
    Stream s;
    engine.add_request(r, s.sink());
    s.wait();
    out.push_back(s.tokens);
  }
  return out;
}

TEST(EngineCore, TheEngineSeedMakesUnseededSamplingReproducible) {
  const auto a = sample_unseeded(7);
  EXPECT_EQ(sample_unseeded(7), a);
  EXPECT_NE(a[0], a[1]);  // each request draws its own seed
  const auto b = sample_unseeded(8);
  EXPECT_NE(b[0], a[0]);
  EXPECT_NE(b[1], a[1]);
  // A request's own seed does not depend on the engine's.
  EXPECT_EQ(sample_unseeded(7, 99)[2], sample_unseeded(8, 99)[2]);
}

TEST(EngineCore, StepTokensAndRequestPhasesAreReported) {
  auto model = std::make_unique<test::FakeModel>(8, 64, kVocab);
  test::FakeModel& fake = *model;
  EngineCore engine(std::move(model), {});
  engine.start();
  std::mutex mu;
  std::condition_variable cv;
  std::optional<RequestTimings> timings;
  engine.add_request(request("t", prompt_of(20, 2), 5), [&](const RequestOutput& out) {
    if (!out.finished) return;
    std::lock_guard lock(mu);
    timings = out.timings;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return timings.has_value(); });
  }
  EXPECT_GT(timings->prefill_s, 0.0);
  EXPECT_GT(timings->decode_s, 0.0);
  EXPECT_DOUBLE_EQ(timings->inference_s, timings->prefill_s + timings->decode_s);
  EXPECT_LE(timings->queue_s + timings->inference_s, timings->e2e_s);
  engine.shutdown(true);
  const EngineStats stats = engine.stats();
  uint64_t steps = 0;
  for (uint64_t n : stats.iteration_tokens_counts) steps += n;
  EXPECT_EQ(steps, stats.num_steps);
  EXPECT_EQ(stats.iteration_tokens_sum, fake.total_tokens);  // 20 prompt tokens + 4 decodes
  EXPECT_EQ(stats.iteration_tokens_counts[3], 1u);           // the prompt step, in (16, 32]
  EXPECT_EQ(stats.iteration_tokens_counts[0], 4u);           // the decodes, in (0, 1]
}

TEST(EngineCore, AddRequestRejectsInvalidRequestsWithClearMessages) {
  EngineConfig config;
  config.max_model_len = 100;
  EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), config);
  auto err = [&](EngineRequest r) { return error_of([&] { engine.add_request(std::move(r), nullptr); }); };
  EXPECT_NE(err(request("a", {}, 5)).find("at least one token"), std::string::npos);
  EXPECT_NE(err(request("a", {1, kVocab}, 5)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(err(request("a", {1, -1}, 5)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(err(request("a", prompt_of(101, 1), 0)).find("more than the maximum model length of 100"),
            std::string::npos);
  EXPECT_NE(err(request("a", prompt_of(90, 1), 11)).find("maximum context length is 100 tokens"), std::string::npos);
  EXPECT_NE(err(request("", {1}, 1)).find("id"), std::string::npos);
  auto bad = request("a", {1}, 1);
  bad.sampling.top_p = 2.0f;
  EXPECT_NE(err(bad).find("top_p"), std::string::npos);
  EXPECT_EQ(err(request("ok", prompt_of(90, 1), 10)), "");  // exactly fits
  EXPECT_NE(err(request("ok", {1}, 1)).find("already in flight"), std::string::npos);
  engine.shutdown(false);
  EXPECT_NE(err(request("late", {1}, 1)).find("shutting down"), std::string::npos);
}

TEST(EngineCore, ConcurrentStreamingClientsWithDisconnectsMatchSequentialRuns) {
  EngineConfig config;
  config.max_num_seqs = 16;
  config.max_num_batched_tokens = 96;
  config.max_model_len = 256;
  // 40 blocks of 8 = 320 tokens of KV for 64 clients: preemption happens too.
  EngineCore engine(std::make_unique<test::FakeModel>(8, 40, kVocab), config);
  engine.start();
  constexpr int kClients = 64;
  std::vector<Stream> streams(kClients);
  std::vector<std::vector<int32_t>> prompts(kClients);
  std::vector<int> max_tokens(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    prompts[i] = prompt_of(1 + static_cast<int>(test::mix64(i) % 60), i);
    max_tokens[i] = 3 + i % 17;
    clients.emplace_back([&, i] {
      const std::string id = fmt::format("c{}", i);
      engine.add_request(request(id, prompts[i], max_tokens[i]), streams[i].sink());
      if (i % 5 == 0) {  // this client disconnects after its first token (or right away)
        for (;;) {
          {
            std::lock_guard lock(streams[i].mu);
            if (!streams[i].tokens.empty() || streams[i].finals) break;
          }
          std::this_thread::yield();
        }
        engine.abort(id);
      }
      streams[i].wait();
    });
  }
  for (auto& t : clients) t.join();
  int completed = 0;
  for (int i = 0; i < kClients; ++i) {
    Stream& s = streams[i];
    EXPECT_EQ(s.finals, 1) << i;
    EXPECT_EQ(s.outputs_after_final, 0) << i;
    const auto expected = oracle_greedy(prompts[i], max_tokens[i]);
    if (s.reason == FinishReason::kLength) {
      EXPECT_EQ(s.tokens, expected) << i;
      ++completed;
    } else {
      EXPECT_EQ(s.reason, FinishReason::kAbort) << i;
      EXPECT_EQ(i % 5, 0) << i;
      EXPECT_TRUE(std::equal(s.tokens.begin(), s.tokens.end(), expected.begin())) << i << ": aborted prefix wrong";
    }
  }
  EXPECT_GE(completed, kClients * 4 / 5);
  engine.shutdown(true);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.num_used_kv_blocks, 0);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_EQ(stats.finished_error, 0u);
  EXPECT_EQ(stats.finished_length + stats.finished_abort, static_cast<uint64_t>(kClients));
}

// tool_choice "required" / named: forced tokens follow the trigger (or start the output), the
// model decides the rest, and all of it is what a greedy oracle gives on that forced context.
TEST(EngineCore, ForcedTokensFollowTheirTriggerAndTheRestIsSampled) {
  EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), {});
  engine.start();
  const std::vector<int32_t> prompt = prompt_of(5, 3);

  // From the first output token.
  EngineRequest now = request("now", prompt, 6);
  now.sampling.forced_tokens = {7, 8, 9};
  Stream a;
  engine.add_request(now, a.sink());
  a.wait();
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), {7, 8, 9});
  std::vector<int32_t> expected = {7, 8, 9};
  for (int32_t t : oracle_greedy(context, 3)) expected.push_back(t);
  EXPECT_EQ(a.tokens, expected);

  // After a trigger the model itself produces: its second greedy token.
  const std::vector<int32_t> free_run = oracle_greedy(prompt, 2);
  EngineRequest later = request("later", prompt, 6);
  later.sampling.forced_after = {free_run[1]};
  later.sampling.forced_tokens = {1, 2};
  Stream b;
  engine.add_request(later, b.sink());
  b.wait();
  context = prompt;
  context.insert(context.end(), {free_run[0], free_run[1], 1, 2});
  expected = {free_run[0], free_run[1], 1, 2};
  for (int32_t t : oracle_greedy(context, 2)) expected.push_back(t);
  EXPECT_EQ(b.tokens, expected);

  // A trigger that never comes forces nothing.
  EngineRequest never = request("never", prompt, 4);
  never.sampling.forced_after = {kVocab - 1, kVocab - 1, kVocab - 1};
  never.sampling.forced_tokens = {1};
  Stream c;
  engine.add_request(never, c.sink());
  c.wait();
  EXPECT_EQ(c.tokens, oracle_greedy(prompt, 4));

  EngineRequest bad = request("bad", prompt, 4);
  bad.sampling.forced_tokens = {kVocab};
  EXPECT_NE(error_of([&] { engine.add_request(bad, [](const RequestOutput&) {}); }).find("forced token"),
            std::string::npos);
}

// Anthropic's thinking.budget_tokens: the reasoning closer is forced once the output reaches the
// budget, unless the model closed its reasoning first; a tool call forced after reasoning follows
// the forced closer.
TEST(EngineCore, ReasoningBudgetForcesTheCloserOnce) {
  EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), {});
  engine.start();
  const std::vector<int32_t> prompt = prompt_of(6, 4);
  const std::vector<int32_t> free_run = oracle_greedy(prompt, 8);
  auto run = [&](const std::string& id, const SamplingParams& sampling) {
    EngineRequest r = request(id, prompt, 8);
    r.sampling.reasoning_budget = sampling.reasoning_budget;
    r.sampling.reasoning_end = sampling.reasoning_end;
    r.sampling.forced_after = sampling.forced_after;
    r.sampling.forced_tokens = sampling.forced_tokens;
    Stream s;
    engine.add_request(r, s.sink());
    s.wait();
    return s.tokens;
  };
  auto continued = [&](std::vector<int32_t> head, int total) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), head.begin(), head.end());
    for (int32_t t : oracle_greedy(context, total - static_cast<int>(head.size()))) head.push_back(t);
    return head;
  };

  // The budget of 3 is spent: the closer {5, 6} comes next, then the model goes on.
  SamplingParams capped;
  capped.reasoning_budget = 3;
  capped.reasoning_end = {5, 6};
  EXPECT_EQ(run("capped", capped), continued({free_run[0], free_run[1], free_run[2], 5, 6}, 8));

  // The model closes its reasoning (its own second token) within the budget: nothing is forced.
  SamplingParams closed;
  closed.reasoning_budget = 4;
  closed.reasoning_end = {free_run[1]};
  EXPECT_EQ(run("closed", closed), free_run);

  // A zero budget closes at once, and the forced tool-call opener follows the closer.
  SamplingParams tool;
  tool.reasoning_budget = 0;
  tool.reasoning_end = {5};
  tool.forced_after = {5};
  tool.forced_tokens = {1, 2};
  EXPECT_EQ(run("tool", tool), continued({5, 1, 2}, 8));

  EngineRequest bad = request("bad", prompt, 4);
  bad.sampling.reasoning_budget = 2;
  EXPECT_NE(error_of([&] { engine.add_request(bad, [](const RequestOutput&) {}); }).find("reasoning_end"),
            std::string::npos);
}

TEST(EngineCore, DataParallelLanesSendAConversationBackToItsPrefix) {
  // Two lanes of one step group (fake models, 16-token blocks). Turn 1 runs on lane 0; a long
  // request then keeps lane 0 busy; turn 2 (turn 1's prompt and answer, then more) still goes to
  // lane 0, where its prefix is cached, although lane 1 is idle.
  std::vector<std::unique_ptr<ModelRunner>> lanes;
  for (int i = 0; i < 2; ++i) lanes.push_back(std::make_unique<test::FakeModel>(16, 64, kVocab));
  EngineConfig config;
  config.max_model_len = 512;
  EngineCore engine(std::move(lanes), config);
  engine.start();
  struct Turn {
    Stream stream;
    int cached = -1;
  };
  const auto run = [&](Turn& t, const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    engine.add_request(request(id, std::move(prompt), max_tokens), [&t, sink = t.stream.sink()](const RequestOutput& o) {
      if (t.cached < 0 && o.num_prompt_tokens > 0) t.cached = o.num_cached_prompt_tokens;
      sink(o);
    });
  };
  const std::vector<int32_t> first = prompt_of(64, 1);
  Turn one;
  run(one, "turn-1", first, 4);
  one.stream.wait();
  EXPECT_EQ(one.cached, 0);
  Turn blocker;
  run(blocker, "blocker", prompt_of(20, 2), 400);
  std::vector<int32_t> second = first;
  second.insert(second.end(), one.stream.tokens.begin(), one.stream.tokens.end());
  const std::vector<int32_t> more = prompt_of(20, 3);
  second.insert(second.end(), more.begin(), more.end());
  Turn two;
  run(two, "turn-2", second, 4);
  two.stream.wait();
  EXPECT_EQ(two.cached, 64) << "turn 2 did not find turn 1's blocks: it ran on the other lane";
  // An unrelated prompt meanwhile balances onto the idle lane: nothing cached there.
  Turn other;
  run(other, "other", prompt_of(64, 4), 4);
  other.stream.wait();
  EXPECT_EQ(other.cached, 0);
  engine.abort("blocker");
  blocker.stream.wait();
  engine.shutdown(true);
}

TEST(EngineCore, SinkMayAbortAndIdsAreReusableAfterFinishing) {
  EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), {});
  engine.start();
  Stream s;
  std::atomic<int> seen{0};
  auto inner = s.sink();
  engine.add_request(request("x", prompt_of(5, 1), 100), [&](const RequestOutput& out) {
    inner(out);
    if (++seen == 3) engine.abort("x");  // stop after 3 outputs, from the engine thread itself
  });
  s.wait();
  EXPECT_EQ(s.reason, FinishReason::kAbort);
  EXPECT_GE(s.tokens.size(), 3u);
  EXPECT_LT(s.tokens.size(), 100u);
  Stream again;
  engine.add_request(request("x", prompt_of(5, 1), 4), again.sink());
  again.wait();
  EXPECT_EQ(again.tokens, oracle_greedy(prompt_of(5, 1), 4));
}

TEST(EngineCore, ShutdownDrainFinishesAndShutdownNowAborts) {
  {
    EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), {});
    Stream s;
    engine.add_request(request("d", prompt_of(9, 2), 20), s.sink());  // queued before start
    engine.start();
    engine.shutdown(true);
    EXPECT_EQ(s.finals, 1);
    EXPECT_EQ(s.reason, FinishReason::kLength);
    EXPECT_EQ(s.tokens, oracle_greedy(prompt_of(9, 2), 20));
  }
  {
    EngineCore engine(std::make_unique<test::FakeModel>(8, 64, kVocab), {});
    Stream s;
    engine.add_request(request("n", prompt_of(9, 2), 200), s.sink());
    engine.shutdown(false);  // never started: still owes a final output
    EXPECT_EQ(s.finals, 1);
    EXPECT_EQ(s.reason, FinishReason::kAbort);
    engine.shutdown(false);  // idempotent
  }
}

}  // namespace
}  // namespace m3
