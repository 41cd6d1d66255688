// Adaptive verification (engine/adaptive_verification.h): the threshold is the commit rate times
// the fitted cost of a token, unknown (0) until steps of different sizes were seen; a request's
// drafts are cut before the first slot whose running confidence falls below it; one proposal in 16
// is a probe. Through the engine on the fake model (whose steps are made to cost time per token):
// drafts are cut, greedy requests keep plain decoding's text, and sampled requests with
// probabilistic drafts keep the target's distribution (two-sample chi-square over 4,000 seeds), as
// they must when a cut never depends on the draft it cuts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include <fmt/core.h>

#include "engine/adaptive_verification.h"
#include "engine/engine_loop.h"
#include "engine/speculative_config.h"
#include "fake_model.h"
#include "ops/rejection_sampling.h"
#include "tests/engine/chi_square.h"
#include "tests/engine/test_drafts.h"

namespace m3 {
namespace {

TEST(AdaptiveVerification, ThresholdIsTheRateTimesTheCostOfAToken) {
  AdaptiveVerification a;
  const std::vector<float> conf = {0.9f, 0.5f, 0.5f};
  a.begin_proposal();
  EXPECT_EQ(a.threshold(), 0.0);
  EXPECT_EQ(a.keep(3, conf), 3u);  // nothing known: every draft
  for (int i = 0; i < 20; ++i) a.observe(64, 0, 40, 0.001 + 0.0005 * 64);  // one size only: no slope
  EXPECT_EQ(a.threshold(), 0.0);
  AdaptiveVerification b;
  // Steps of 32 and 64 tokens, 1 ms + 0.25 ms a token, committing 50 tokens each.
  for (int i = 0; i < 40; ++i) {
    const int tokens = i % 2 ? 32 : 64;
    b.observe(tokens, 0, 50, 0.001 + 0.00025 * tokens);
  }
  const double mean_seconds = 0.001 + 0.00025 * 48;
  EXPECT_NEAR(b.threshold(), 50 / mean_seconds * 0.00025, 0.03);  // about 0.96 (the rate weighs recent steps more)
  // Prompt chunks in the steps have a price of their own (here 0.05 ms a token, a fifth of a row's):
  // the cost of a row stays 0.25 ms.
  AdaptiveVerification c;
  for (int i = 0; i < 60; ++i) {
    const int tokens = i % 2 ? 32 : 64, prompt = (i / 2) % 3 * 200;
    c.observe(tokens, prompt, 50, 0.001 + 0.00025 * tokens + 0.00005 * prompt);
  }
  const double seconds = 0.001 + 0.00025 * 48 + 0.00005 * 200;
  EXPECT_NEAR(c.threshold(), 50 / seconds * 0.00025, 0.03);

  b.begin_proposal();
  EXPECT_EQ(b.keep(3, std::vector<float>{0.99f, 0.99f, 0.9f}), 2u);  // 0.98 then 0.88
  EXPECT_EQ(b.keep(3, std::vector<float>{0.5f, 1.0f, 1.0f}), 0u);
  EXPECT_EQ(b.keep(3, {}), 3u);  // no confidences: nothing to cut by
  // Every 16th proposal verifies the first half, whatever the confidences.
  for (uint64_t p = 2; p < AdaptiveVerification::kProbeEvery; ++p) {
    b.begin_proposal();
    EXPECT_FALSE(b.probing());
  }
  b.begin_proposal();
  EXPECT_TRUE(b.probing());
  EXPECT_EQ(b.keep(3, std::vector<float>{0.1f, 0.1f, 0.1f}), 2u);
  EXPECT_EQ(b.keep(4, std::vector<float>{1.0f, 1.0f, 1.0f, 1.0f}), 2u);
}

constexpr int kVocab = 9;

// High after a third of the tokens, low after the others: the cuts follow the drafts closely.
float confidence_after(int32_t token) { return token % 3 == 0 ? 0.95f : 0.1f; }

// Probabilistic drafts from a distribution near the model's, with a confidence per draft
// that reads the draft before it (as DSpark's head reads its Markov state), never the draft itself.
// (A confidence that read the draft itself, confidence_after(draft), fails the chi-square test
// below: the cuts would then favour some draws.)
class ConfidentNoiseDrafter final : public Drafter {
 public:
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override {
    drafts.assign(requests.size(), Draft());
    std::vector<float> logits(kVocab);
    for (size_t i = 0; i < requests.size(); ++i) {
      const DraftRequest& r = requests[i];
      const SampleBatch batch = test::test_draft_batch(r);
      SampleWorkspace ws;
      std::vector<int32_t> context(r.tokens.begin(), r.tokens.end());
      std::vector<float> noise(kVocab);
      for (int j = 0; j < r.max_drafts; ++j) {
        drafts[i].confidence.push_back(confidence_after(context.back()));
        // Near the model's distribution (its logits after the text and the drafts so far, plus
        // noise): many drafts are kept, and a biased cut would show.
        test::fake_logits(context, kVocab, logits.data());
        test::fake_logits({4242, static_cast<int32_t>(context.size())}, kVocab, noise.data());
        for (int v = 0; v < kVocab; ++v) logits[v] += 0.5f * noise[v];
        const int32_t id = test::draw_test_draft(r, j, logits.data(), kVocab, batch, ws, drafts[i]);
        drafts[i].tokens.push_back(id);
        context.push_back(id);
      }
    }
  }
};

using Outputs = std::map<std::string, std::vector<int32_t>>;

Outputs run(EngineConfig config, const std::vector<EngineRequest>& reqs, std::unique_ptr<Drafter> drafter,
            EngineStats* stats = nullptr) {
  test::FakeModel model(8, 8192, kVocab);
  // A step costs time per token, so the fitted cost of a token is not zero.
  model.before_forward = [](const StepBatch& b) {
    std::this_thread::sleep_for(std::chrono::microseconds(100 + 15 * b.num_tokens()));
  };
  config.max_model_len = 2048;
  EngineLoop loop(model, config, std::move(drafter));
  Outputs out;
  for (const EngineRequest& r : reqs) {
    loop.add(r, [&out, id = r.id](const RequestOutput& o) {
      out[id].insert(out[id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }, *r.sampling.seed, Clock::now());
  }
  while (loop.has_work()) loop.step();
  if (stats) *stats = loop.stats();
  return out;
}

TEST(AdaptiveVerification, CutsDraftsAndKeepsTheTargetsDistribution) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4004; ++i) {
    EngineRequest r;
    r.id = fmt::format("a{}", i);
    r.prompt_token_ids = {2, 7, 1, 8, 2, 8};
    if (i < 4) r.prompt_token_ids.push_back(20 + i);
    r.sampling.max_tokens = 10;
    r.sampling.temperature = i < 4 ? 0.0f : 1.0f;
    r.sampling.seed = 3000 + i;
    r.sampling.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  EngineConfig plain;
  plain.max_num_seqs = 64;
  const Outputs reference = run(plain, reqs, nullptr);
  EngineConfig config = plain;
  config.speculative = parse_speculative_config(
      R"({"method":"dspark","num_speculative_tokens":4,"draft_sample_method":"probabilistic","enable_adaptive_verification":true})");
  EngineStats stats;
  const Outputs got = run(config, reqs, std::make_unique<ConfidentNoiseDrafter>(), &stats);
  for (int i = 0; i < 4; ++i) {
    const std::string id = fmt::format("a{}", i);
    EXPECT_EQ(got.at(id), reference.at(id)) << "greedy " << id;
  }
  EXPECT_GT(stats.spec_num_unverified_draft_tokens, 500u) << "adaptive verification cut drafts";
  EXPECT_GT(stats.spec_num_draft_tokens, 500u) << "and verified others";
  EXPECT_GT(stats.spec_num_accepted_tokens, 0u);
  EXPECT_GT(stats.spec_verify_threshold, 0.0);
  for (size_t pos = 1; pos < 10; ++pos) {
    std::vector<int32_t> a, b;
    for (size_t i = 4; i < reqs.size(); ++i) {
      a.push_back(reference.at(reqs[i].id).at(pos));
      b.push_back(got.at(reqs[i].id).at(pos));
    }
    const auto [stat, df] = test::two_sample_chi_square(a, b);
    const double critical = test::chi_square_critical_1e4(df);
    EXPECT_LT(stat, critical) << "token " << pos;
    std::printf("[adaptive] token %zu chi-square %.1f, %d df (critical %.1f)\n", pos, stat, df, critical);
  }
  std::printf("[adaptive] %llu drafts verified, %llu kept, %llu not verified; threshold %.2f\n",
              static_cast<unsigned long long>(stats.spec_num_draft_tokens),
              static_cast<unsigned long long>(stats.spec_num_accepted_tokens),
              static_cast<unsigned long long>(stats.spec_num_unverified_draft_tokens), stats.spec_verify_threshold);
}

}  // namespace
}  // namespace m3
