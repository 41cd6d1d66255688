// Speculative verification (ops/rejection_sampling.h) against the target's own sampling: greedy
// output identical to non-speculative greedy, sampled output distributed as the target's
// (chi-square over many seeds, first tokens and whole short sequences, with a deliberately bad
// drafter), synthetic mode at its requested acceptance length.
#include "ops/rejection_sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"

namespace m3 {
namespace {

constexpr int32_t kVocab = 5;

// A toy language model: logits from a hash of (prefix, id, salt), sampled with `row`'s settings
// through the sampler's own processing (sample_distribution), so masks like top_k give tokens
// of probability zero.
struct ToyModel {
  uint64_t salt;
  SampleRow row;
  float sharpness = 2.0f;

  TokenDistribution at(const std::vector<int32_t>& prefix) const {
    uint64_t h = salt;
    for (int32_t t : prefix) h = splitmix64(h ^ static_cast<uint64_t>(t + 1));
    std::vector<float> logits(kVocab);
    for (int32_t i = 0; i < kVocab; ++i) logits[i] = sharpness * static_cast<float>(counter_uniform(h, i) * 2.0 - 1.0);
    SampleBatch batch;
    batch.add(row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
    SampleWorkspace ws;
    TokenDistribution d;
    sample_distribution(logits.data(), kVocab, batch.rows[0], batch, ws, d);
    return d;
  }
};

SampleRow sampled_row(float temperature, int32_t top_k = 0, float top_p = 1.0f) {
  SampleRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  return r;
}

// One speculative run of `length` tokens: the drafter proposes k tokens from its own model
// (sampled with `rng`, or its argmax when greedy_drafter), the target verifies, repeat.
// Returns the tokens and adds the steps and kept drafts to the counters.
std::vector<int32_t> speculate(const ToyModel& target, const ToyModel& drafter, bool greedy_drafter, int k,
                               RejectionMethod method, uint64_t seed, int length, std::mt19937_64& rng,
                               int64_t* steps, int64_t* kept, std::span<const float> rates = {}) {
  std::vector<int32_t> out;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  while (static_cast<int>(out.size()) < length) {
    std::vector<int32_t> prefix = out, drafts;
    std::vector<TokenDistribution> q, p;
    for (int i = 0; i < k; ++i) {
      TokenDistribution d = drafter.at(prefix);
      int32_t x;
      if (greedy_drafter) {
        size_t best = 0;  // the argmax, lowest id on a tie
        for (size_t j = 1; j < d.ids.size(); ++j)
          if (d.mass[j] > d.mass[best]) best = j;
        x = d.ids[best];
      } else {
        x = d.draw(unit(rng));
      }
      drafts.push_back(x);
      q.push_back(std::move(d));
      prefix.push_back(x);
    }
    prefix = out;
    for (int i = 0; i <= k; ++i) {
      p.push_back(target.at(prefix));
      if (i < k) prefix.push_back(drafts[static_cast<size_t>(i)]);
    }
    DraftVerification v;
    v.method = method;
    v.target = p;
    v.drafts = drafts;
    if (!greedy_drafter) v.draft = q;
    v.synthetic_rates = rates;
    v.seed = seed;
    v.output_index = static_cast<int64_t>(out.size());
    const VerifiedTokens r = verify_drafts(v);
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(r.accepted + 1));
    out.insert(out.end(), r.tokens.begin(), r.tokens.end());
    ++*steps;
    *kept += r.accepted;
  }
  out.resize(static_cast<size_t>(length));
  return out;
}

// The chi-square statistic's critical value at p = 1e-6 (Wilson-Hilferty).
double chi_square_critical(int df) {
  const double z = 4.753, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Sequences of `length` tokens from speculation against their exact probability under the target.
void expect_target_distribution(RejectionMethod method, bool greedy_drafter, int k, int length, int trials) {
  const ToyModel target{11, sampled_row(0.9f, /*top_k=*/4)};
  ToyModel drafter{977, sampled_row(0.5f)};  // another model, sharper: a bad drafter
  drafter.sharpness = 4.0f;
  std::mt19937_64 rng(12345);
  std::map<std::vector<int32_t>, int64_t> seen;
  int64_t steps = 0, kept = 0;
  for (int t = 0; t < trials; ++t)
    ++seen[speculate(target, drafter, greedy_drafter, k, method, 1000003ull * t + 7, length, rng, &steps, &kept)];
  double chi2 = 0.0;
  int cells = 0;
  std::vector<int32_t> seq(static_cast<size_t>(length), 0);
  for (;;) {
    double prob = 1.0;
    std::vector<int32_t> prefix;
    for (int32_t x : seq) {
      prob *= target.at(prefix).prob(x);
      prefix.push_back(x);
    }
    const auto it = seen.find(seq);
    const double observed = it == seen.end() ? 0.0 : static_cast<double>(it->second);
    if (prob == 0.0) {
      EXPECT_EQ(observed, 0.0) << "a sequence the target never samples";
    } else {
      const double expected = prob * trials;
      chi2 += (observed - expected) * (observed - expected) / expected;
      ++cells;
    }
    int i = length - 1;
    while (i >= 0 && ++seq[static_cast<size_t>(i)] == kVocab) seq[static_cast<size_t>(i--)] = 0;
    if (i < 0) break;
  }
  EXPECT_LT(chi2, chi_square_critical(cells - 1))
      << cells << " sequences; " << steps << " steps kept " << kept << " drafts";
  EXPECT_GT(kept, 0) << "the drafter never agreed: the test would not exercise acceptance";
}

TEST(RejectionSampling, StandardMatchesTargetWithSampledDrafts) {
  expect_target_distribution(RejectionMethod::kStandard, false, 3, 3, 60000);
}
TEST(RejectionSampling, StandardMatchesTargetWithGreedyDrafts) {
  expect_target_distribution(RejectionMethod::kStandard, true, 3, 3, 60000);
}
TEST(RejectionSampling, BlockMatchesTargetWithSampledDrafts) {
  expect_target_distribution(RejectionMethod::kBlock, false, 3, 3, 60000);
}
TEST(RejectionSampling, BlockMatchesTargetWithGreedyDrafts) {
  expect_target_distribution(RejectionMethod::kBlock, true, 3, 3, 60000);
}
TEST(RejectionSampling, FirstTokenMatchesTargetAtOneAndSevenDrafts) {
  for (int k : {1, 7})
    for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock})
      expect_target_distribution(m, false, k, 1, 40000);
}

TEST(RejectionSampling, GreedyTargetGivesGreedyText) {
  const ToyModel target{5, sampled_row(0.0f)};
  const ToyModel drafter{6, sampled_row(1.0f)};
  // Non-speculative greedy text.
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) want.push_back(target.at(want).ids[0]);
  for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock})
    for (bool greedy_drafter : {true, false})
      for (int k : {1, 3, 7}) {
        std::mt19937_64 rng(1);
        int64_t steps = 0, kept = 0;
        for (uint64_t seed = 0; seed < 20; ++seed)
          EXPECT_EQ(speculate(target, drafter, greedy_drafter, k, m, seed, 12, rng, &steps, &kept), want)
              << "k " << k << " method " << static_cast<int>(m);
      }
  // A drafter that is the target: every draft kept, k + 1 tokens a step.
  for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock}) {
    std::mt19937_64 rng(2);
    int64_t steps = 0, kept = 0;
    EXPECT_EQ(speculate(target, target, true, 3, m, 0, 12, rng, &steps, &kept), want);
    EXPECT_EQ(steps, 3);
    EXPECT_EQ(kept, 9);
  }
}

// Standard verification of one-hot drafts draws with the sampler's own uniforms, so a seeded
// sampled request gives the text of sequential sampling, token for token, whatever the drafter.
TEST(RejectionSampling, StandardWithOneHotDraftsIsSequentialSampling) {
  const ToyModel target{61, sampled_row(0.8f, /*top_k=*/4)};
  const ToyModel drafter{62, sampled_row(0.0f)};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<int32_t> want;
    for (int i = 0; i < 10; ++i)
      want.push_back(target.at(want).draw(counter_uniform(seed, static_cast<uint64_t>(want.size()))));
    for (int k : {1, 3, 7}) {
      std::mt19937_64 rng(seed);
      int64_t steps = 0, kept = 0;
      EXPECT_EQ(speculate(target, drafter, true, k, RejectionMethod::kStandard, seed, 10, rng, &steps, &kept), want)
          << "seed " << seed << " k " << k;
      // The target as its own drafter keeps most drafts; the output is still the same text.
      EXPECT_EQ(speculate(target, target, true, k, RejectionMethod::kStandard, seed, 10, rng, &steps, &kept), want);
    }
  }
}

// accept_sampled (the engine's path when a device sampler draws each row) keeps what verify_drafts
// keeps, for standard one-hot and synthetic verification.
TEST(RejectionSampling, AcceptSampledAgreesWithVerifyDrafts) {
  const ToyModel target{71, sampled_row(1.0f)};
  const ToyModel drafter{72, sampled_row(0.0f)};
  const std::vector<float> rates = synthetic_rates_for_length(2.6, 4);
  std::mt19937_64 rng(5);
  for (uint64_t seed = 0; seed < 500; ++seed) {
    std::vector<int32_t> prefix, drafts;
    for (int i = 0; i < 4; ++i) {
      // Half the drafts the target's likely token, so some steps keep several.
      const TokenDistribution d = (seed + i) % 2 ? target.at(prefix) : drafter.at(prefix);
      drafts.push_back(d.draw(0.5));
      prefix.push_back(drafts.back());
    }
    if (seed % 7 == 0) drafts[2] = -1;  // padding
    std::vector<TokenDistribution> p;
    std::vector<int32_t> sampled;
    prefix.clear();
    const int64_t index = static_cast<int64_t>(seed % 11);
    for (size_t i = 0; i <= drafts.size(); ++i) {
      p.push_back(target.at(prefix));
      sampled.push_back(p.back().draw(counter_uniform(seed, static_cast<uint64_t>(index) + i)));
      if (i < drafts.size()) prefix.push_back(drafts[i]);
    }
    for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kSynthetic}) {
      DraftVerification v;
      v.method = m;
      v.target = p;
      v.drafts = drafts;
      v.synthetic_rates = rates;
      v.seed = seed;
      v.output_index = index;
      const VerifiedTokens r = verify_drafts(v);
      const int32_t kept = accept_sampled(m, drafts, sampled, rates, seed, index);
      ASSERT_EQ(kept, r.accepted) << seed;
      EXPECT_EQ(sampled[static_cast<size_t>(kept)], r.tokens.back()) << seed;
    }
  }
  const std::vector<int32_t> drafts{1, 2};
  const std::vector<int32_t> short_sampled{1};
  EXPECT_THROW(accept_sampled(RejectionMethod::kStandard, drafts, short_sampled, {}, 0, 0), Error);
  const std::vector<int32_t> sampled{1, 2, 3};
  EXPECT_THROW(accept_sampled(RejectionMethod::kBlock, drafts, sampled, {}, 0, 0), Error);
  EXPECT_EQ(accept_sampled(RejectionMethod::kStandard, drafts, sampled, {}, 0, 0), 2);
}

TEST(RejectionSampling, BlockKeepsAtLeastAsManyAsStandard) {
  const ToyModel target{21, sampled_row(1.0f)};
  const ToyModel drafter{22, sampled_row(1.0f)};
  double mean[2];
  double var[2];
  int idx = 0;
  for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock}) {
    std::mt19937_64 rng(3);
    std::vector<double> per_step;
    for (uint64_t seed = 0; seed < 20000; ++seed) {
      int64_t steps = 0, kept = 0;
      speculate(target, drafter, false, 4, m, seed, 1, rng, &steps, &kept);
      per_step.push_back(static_cast<double>(kept));
    }
    double s = 0, s2 = 0;
    for (double x : per_step) s += x, s2 += x * x;
    mean[idx] = s / per_step.size();
    var[idx] = s2 / per_step.size() - mean[idx] * mean[idx];
    ++idx;
  }
  const double stderr_diff = std::sqrt((var[0] + var[1]) / 20000);
  EXPECT_GE(mean[1], mean[0] - 3 * stderr_diff) << "standard " << mean[0] << ", block " << mean[1];
}

TEST(RejectionSampling, PaddingDraftsAreRejected) {
  const ToyModel target{31, sampled_row(1.0f)};
  std::vector<TokenDistribution> p{target.at({}), target.at({-1})};
  const std::vector<int32_t> drafts{-1};
  for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock}) {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      DraftVerification v;
      v.method = m;
      v.target = p;
      v.drafts = drafts;
      v.seed = seed;
      const VerifiedTokens r = verify_drafts(v);
      EXPECT_EQ(r.accepted, 0);
      ASSERT_EQ(r.tokens.size(), 1u);
      // The correction is the ordinary sampler's draw at that output index.
      EXPECT_EQ(r.tokens[0], p[0].draw(counter_uniform(seed, 0)));
    }
  }
}

TEST(RejectionSampling, SyntheticReachesTheRequestedLength) {
  const ToyModel target{41, sampled_row(1.0f)};
  const ToyModel drafter{42, sampled_row(1.0f)};
  struct Case {
    int k;
    std::vector<float> rates;
    double want;  // tokens a step, counting the target's own
  };
  const std::vector<Case> cases{{7, synthetic_rates_for_length(3.2, 7), 3.2},
                                {3, synthetic_rates_for_length(2.5, 3), 2.5},
                                {3, {0.9f, 0.8f, 0.7f}, 1.0 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.7}};
  for (const Case& c : cases) {
    std::mt19937_64 rng(4);
    int64_t steps = 0, kept = 0;
    for (uint64_t seed = 0; seed < 20000; ++seed)
      speculate(target, drafter, true, c.k, RejectionMethod::kSynthetic, seed, 1, rng, &steps, &kept, c.rates);
    const double length = 1.0 + static_cast<double>(kept) / static_cast<double>(steps);
    EXPECT_NEAR(length, c.want, 0.02 * c.want) << "k " << c.k;
  }
}

TEST(RejectionSampling, SyntheticRatesForLength) {
  EXPECT_EQ(synthetic_rates_for_length(3.2, 7), (std::vector<float>{1, 1, 0.2f, 0, 0, 0, 0}));
  EXPECT_EQ(synthetic_rates_for_length(1.0, 3), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(synthetic_rates_for_length(4.0, 3), (std::vector<float>{1, 1, 1}));
  EXPECT_THROW(synthetic_rates_for_length(4.5, 3), Error);
  EXPECT_THROW(synthetic_rates_for_length(0.5, 3), Error);
  EXPECT_THROW(synthetic_rates_for_length(NAN, 3), Error);
}

TEST(RejectionSampling, MismatchedRowsAreErrors) {
  const ToyModel target{51, sampled_row(1.0f)};
  std::vector<TokenDistribution> p{target.at({})};
  const std::vector<int32_t> drafts{1};
  DraftVerification v;
  v.target = p;
  v.drafts = drafts;
  EXPECT_THROW(verify_drafts(v), Error);  // 1 draft needs 2 target rows
  p.push_back(target.at({1}));
  v.target = p;
  v.method = RejectionMethod::kSynthetic;
  EXPECT_THROW(verify_drafts(v), Error);  // no rates
}

// The reference draw is the distribution's draw: sample_reference and sample_distribution agree.
TEST(RejectionSampling, SamplerDrawsFromItsDistribution) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  constexpr int32_t vocab = 300;
  std::vector<float> logits(vocab);
  SampleWorkspace ws;
  for (int t = 0; t < 400; ++t) {
    for (float& x : logits) x = 3.0f * normal(rng);
    SampleRow row = sampled_row(t % 5 == 0 ? 0.0f : 0.3f + 0.2f * (t % 7), t % 3 == 0 ? 20 : 0,
                                t % 4 == 0 ? 0.8f : 1.0f);
    row.min_p = t % 6 == 0 ? 0.05f : 0.0f;
    row.seed = static_cast<uint64_t>(t);
    row.output_index = t % 13;
    SampleBatch batch;
    batch.add(row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
    TokenDistribution d;
    sample_distribution(logits.data(), vocab, batch.rows[0], batch, ws, d);
    const int32_t want = sample_reference(logits.data(), vocab, batch.rows[0], batch, ws);
    ASSERT_EQ(d.draw(counter_uniform(row.seed, static_cast<uint64_t>(row.output_index))), want) << t;
    double sum = 0;
    for (size_t i = 0; i < d.ids.size(); ++i) sum += d.mass[i];
    EXPECT_NEAR(sum, d.total, 1e-9 * d.total);
    EXPECT_TRUE(std::is_sorted(d.ids.begin(), d.ids.end()));
  }
}

}  // namespace
}  // namespace m3
