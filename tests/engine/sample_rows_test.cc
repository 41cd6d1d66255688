#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/sample_rows.h"

namespace m3 {
namespace {

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

// Frequencies of sampled tokens over `n` draws (output index i = draw i, one seed).
std::vector<double> frequencies(HostSampler& sampler, const std::vector<float>& logits, const SamplingParams& params,
                                int n, uint64_t seed = 1234) {
  std::vector<double> freq(logits.size(), 0.0);
  SamplingState state;
  state.params = &params;
  state.seed = seed;
  for (int i = 0; i < n; ++i) {
    state.output_index = i;
    freq[sampler.sample(logits, state)] += 1.0 / n;
  }
  return freq;
}

SamplingState greedy_state(const SamplingParams& params) {
  SamplingState s;
  s.params = &params;
  return s;
}

TEST(HostSampler, GreedyIsArgmaxWithTiesToTheLowestId) {
  HostSampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}, greedy_state(p)), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-5.0f, -2.0f, -2.5f}, greedy_state(p)), 1);
}

TEST(HostSampler, CounterUniformIsDeterministicAndUniform) {
  EXPECT_EQ(counter_uniform(7, 3), counter_uniform(7, 3));
  EXPECT_NE(counter_uniform(7, 3), counter_uniform(7, 4));
  EXPECT_NE(counter_uniform(7, 3), counter_uniform(8, 3));
  std::vector<int> bins(10, 0);
  const int n = 100000;
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const double u = counter_uniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++bins[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  // Chi-square with 9 degrees of freedom; 27.9 is the 0.999 quantile.
  double chi2 = 0.0;
  for (int b : bins) chi2 += (b - n / 10.0) * (b - n / 10.0) / (n / 10.0);
  EXPECT_LT(chi2, 27.9);
}

TEST(HostSampler, SamplesTheSoftmaxDistribution) {
  HostSampler sampler;
  SamplingParams p;  // temperature 1
  const std::vector<double> probs = {0.5, 0.25, 0.15, 0.07, 0.03};
  const auto freq = frequencies(sampler, log_probs(probs), p, 40000);
  for (std::size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(freq[i], probs[i], 0.01) << i;
}

TEST(HostSampler, TemperatureSharpensAndFlattens) {
  HostSampler sampler;
  const std::vector<double> probs = {0.6, 0.3, 0.1};
  SamplingParams p;
  p.temperature = 0.5f;  // p^2 renormalised: 0.36, 0.09, 0.01 / 0.46
  auto freq = frequencies(sampler, log_probs(probs), p, 40000);
  EXPECT_NEAR(freq[0], 0.36 / 0.46, 0.01);
  EXPECT_NEAR(freq[2], 0.01 / 0.46, 0.005);
  p.temperature = 2.0f;  // sqrt(p) renormalised
  freq = frequencies(sampler, log_probs(probs), p, 40000);
  const double z = std::sqrt(0.6) + std::sqrt(0.3) + std::sqrt(0.1);
  EXPECT_NEAR(freq[0], std::sqrt(0.6) / z, 0.01);
  EXPECT_NEAR(freq[2], std::sqrt(0.1) / z, 0.01);
}

TEST(HostSampler, TopKKeepsTheKMostLikely) {
  HostSampler sampler;
  SamplingParams p;
  p.top_k = 2;
  const auto freq = frequencies(sampler, log_probs({0.1, 0.4, 0.2, 0.3}), p, 20000);
  EXPECT_EQ(freq[0], 0.0);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_NEAR(freq[1], 0.4 / 0.7, 0.015);
  EXPECT_NEAR(freq[3], 0.3 / 0.7, 0.015);
}

TEST(HostSampler, TopPFollowsVllmCumulativeRule) {
  HostSampler sampler;
  SamplingParams p;
  p.top_p = 0.75f;  // ascending cumsum 0.05, 0.2, 0.5, 1.0: drops the two <= 0.25
  const auto freq = frequencies(sampler, log_probs({0.15, 0.5, 0.05, 0.3}), p, 20000);
  EXPECT_EQ(freq[0], 0.0);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_NEAR(freq[1], 0.5 / 0.8, 0.015);
  EXPECT_NEAR(freq[3], 0.3 / 0.8, 0.015);
  p.top_p = 0.01f;  // the most likely token always survives
  const auto only = frequencies(sampler, log_probs({0.15, 0.5, 0.05, 0.3}), p, 100);
  EXPECT_NEAR(only[1], 1.0, 1e-9);
}

TEST(HostSampler, MinPDropsTokensBelowAFractionOfTheMax) {
  HostSampler sampler;
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.1: drops 0.05
  const auto freq = frequencies(sampler, log_probs({0.5, 0.3, 0.15, 0.05}), p, 20000);
  EXPECT_EQ(freq[3], 0.0);
  EXPECT_NEAR(freq[0], 0.5 / 0.95, 0.015);
  EXPECT_NEAR(freq[2], 0.15 / 0.95, 0.015);
}

TEST(HostSampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  HostSampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f, -1.5f};
  const std::vector<int32_t> prompt = {0};  // 3 -> 1.5: token 1 wins
  std::unordered_map<int32_t, int32_t> counts;
  SamplingState s = greedy_state(p);
  s.prompt_token_set = prompt;
  s.output_counts = &counts;
  EXPECT_EQ(sampler.sample(logits, s), 1);
  counts[1] = 1;  // output tokens count too: 2 -> 1, 3 -> 1.5: token 0 again
  EXPECT_EQ(sampler.sample(logits, s), 0);
  // Negative logits get more negative: -1 * 2 = -2 < -1.5.
  const std::vector<float> negative = {-1.0f, -1.5f};
  const std::vector<int32_t> prompt2 = {0};
  std::unordered_map<int32_t, int32_t> none;
  SamplingState s2 = greedy_state(p);
  s2.prompt_token_set = prompt2;
  s2.output_counts = &none;
  EXPECT_EQ(sampler.sample(negative, s2), 1);
}

TEST(HostSampler, FrequencyAndPresencePenaltiesCountOutputTokensOnly) {
  HostSampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 0.5f;
  const std::vector<float> logits = {2.0f, 1.2f, 0.0f};
  std::unordered_map<int32_t, int32_t> counts = {{0, 1}};
  const std::vector<int32_t> prompt = {1};  // prompt tokens are not penalised by these
  SamplingState s = greedy_state(p);
  s.output_counts = &counts;
  s.prompt_token_set = prompt;
  EXPECT_EQ(sampler.sample(logits, s), 0);  // 2 - 0.5 = 1.5 > 1.2
  counts[0] = 2;                            // 2 - 1.0 = 1.0 < 1.2
  EXPECT_EQ(sampler.sample(logits, s), 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.9f;  // once, whatever the count: 2 - 0.9 = 1.1 < 1.2
  EXPECT_EQ(sampler.sample(logits, s), 1);
  p.presence_penalty = -1.0f;  // negative values encourage repetition
  counts = {{2, 5}};
  EXPECT_EQ(sampler.sample(logits, s), 0);
}

TEST(HostSampler, MinTokensMasksStopTokens) {
  HostSampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 2;
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f};
  const std::vector<int32_t> masked = {1};
  SamplingState s = greedy_state(p);
  s.min_tokens_masked = masked;
  s.output_index = 1;
  EXPECT_EQ(sampler.sample(logits, s), 2);
  s.output_index = 2;
  EXPECT_EQ(sampler.sample(logits, s), 1);
}

TEST(HostSampler, LogitBiasIsAddedBeforeThePenalties) {
  HostSampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, 2.0f};
  SamplingState s = greedy_state(p);
  EXPECT_EQ(sampler.sample(logits, s), 1);
  p.logit_bias_ids = {0};
  p.logit_bias_values = {100.0f};
  EXPECT_EQ(sampler.sample(logits, s), 0);  // +100 makes a token win
  p.logit_bias_ids = {1};
  p.logit_bias_values = {-100.0f};
  EXPECT_EQ(sampler.sample(logits, s), 3);  // -100 bans the argmax
  // A masked token stays masked whatever its bias.
  p.min_tokens = 1;
  const std::vector<int32_t> masked = {0};
  s.min_tokens_masked = masked;
  p.logit_bias_ids = {0, 1};
  p.logit_bias_values = {100.0f, -100.0f};
  EXPECT_EQ(sampler.sample(logits, s), 3);

  // Sampled: exactly the draws of the biased logits without a bias, penalties included (the
  // bias comes first, so the penalty sees the biased logit).
  std::vector<float> wide(40);
  for (int i = 0; i < 40; ++i) wide[i] = static_cast<float>(std::cos(i * 0.9));
  SamplingParams biased;
  biased.temperature = 0.9f;
  biased.top_p = 0.95f;
  biased.repetition_penalty = 1.4f;
  biased.logit_bias_ids = {2, 7, 30};
  biased.logit_bias_values = {3.0f, -2.5f, 1.25f};
  SamplingParams plain = biased;
  plain.logit_bias_ids.clear();
  plain.logit_bias_values.clear();
  std::vector<float> shifted = wide;
  for (size_t i = 0; i < biased.logit_bias_ids.size(); ++i) shifted[biased.logit_bias_ids[i]] += biased.logit_bias_values[i];
  const std::vector<int32_t> prompt = {2, 5, 30};
  SamplingState a, b;
  a.params = &biased;
  b.params = &plain;
  a.prompt_token_set = b.prompt_token_set = prompt;
  int differs_from_unbiased = 0;
  for (int i = 0; i < 300; ++i) {
    a.seed = b.seed = 7 + i;
    const int32_t got = sampler.sample(wide, a);
    EXPECT_EQ(got, sampler.sample(shifted, b)) << "draw " << i;
    differs_from_unbiased += got != sampler.sample(wide, b);
  }
  EXPECT_GT(differs_from_unbiased, 0);
}

TEST(HostSampler, SeededDrawsDependOnlyOnSeedAndIndex) {
  HostSampler a, b;
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = static_cast<float>(std::sin(i * 1.7));
  SamplingState s;
  s.params = &p;
  std::vector<int32_t> run1, run2, other;
  for (int i = 0; i < 200; ++i) {
    s.seed = 99;
    s.output_index = i;
    run1.push_back(a.sample(logits, s));
    run2.push_back(b.sample(logits, s));
    s.seed = 100;
    other.push_back(a.sample(logits, s));
  }
  EXPECT_EQ(run1, run2);
  EXPECT_NE(run1, other);
}

TEST(PositionLogprobs, TheAskedTokensAnswerWithTheRowsTopK) {
  RowLogprobs row;
  row.token[0] = 7;
  row.token[1] = 2;
  row.logprob[0] = -0.5f;
  row.logprob[1] = -3.0f;
  row.rank[0] = 1;
  row.rank[1] = 4;
  row.num_top = 2;
  row.top_id[0] = 7;
  row.top_id[1] = 9;
  row.top_logprob[0] = -0.5f;
  row.top_logprob[1] = -1.5f;
  const PositionLogprobs drawn = position_logprobs(row, 7), draft = position_logprobs(row, 2);
  EXPECT_EQ(drawn.token_id, 7);
  EXPECT_EQ(drawn.logprob, -0.5f);
  EXPECT_EQ(drawn.rank, 1);
  ASSERT_EQ(drawn.top.size(), 2u);
  EXPECT_EQ(drawn.top[1].token_id, 9);
  EXPECT_EQ(drawn.top[1].logprob, -1.5f);
  EXPECT_EQ(draft.logprob, -3.0f);
  EXPECT_EQ(draft.rank, 4);
  EXPECT_THROW(position_logprobs(row, 5), Error);
  EXPECT_THROW(position_logprobs(RowLogprobs{}, -1), Error);
}

TEST(SamplingParams, ValidateNamesTheField) {
  auto message = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    try {
      p.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message([](SamplingParams&) {}), "");
  EXPECT_NE(message([](SamplingParams& p) { p.temperature = -1; }).find("temperature"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.min_p = 1.5f; }).find("min_p"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.logit_bias_ids = {3}, p.logit_bias_values = {101.0f}; }).find("logit_bias"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.logit_bias_ids = {3, 3}, p.logit_bias_values = {1.0f, 2.0f}; })
                .find("distinct"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.logit_bias_ids = {3}; }).find("logit_bias"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.presence_penalty = 3; }).find("presence_penalty"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.frequency_penalty = -3; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.max_tokens = -1; }).find("max_tokens"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.min_tokens = 20; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.logprobs = 21; }).find("logprobs"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.prompt_logprobs = -2; }).find("prompt_logprobs"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.stop_token_ids = {-4}; }).find("stop_token_ids"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.temperature = NAN; }).find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace m3
