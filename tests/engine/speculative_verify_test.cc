// The engine's verification of one request's drafts: each target row sampled at its own output
// index with the drafts before it counted (penalties, min_tokens), checked against sequential
// sampling with HostSampler.
#include "engine/speculative_verify.h"

#include <gtest/gtest.h>

#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace m3 {
namespace {

constexpr int32_t kVocab = 7;

// Logits of a toy target after `prefix`: a hash of the prefix, so every position differs.
std::vector<float> toy_logits(const std::vector<int32_t>& prefix) {
  uint64_t h = 99;
  for (int32_t t : prefix) h = splitmix64(h ^ static_cast<uint64_t>(t + 1));
  std::vector<float> out(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) out[i] = static_cast<float>(4.0 * counter_uniform(h, i));
  return out;
}

const std::vector<int32_t> kEos{6};

// The request after the outputs `out` (counted in `counts`), eos masked below min_tokens.
SamplingState state_after(const SamplingParams& p, uint64_t seed, const std::vector<int32_t>& out,
                          const std::unordered_map<int32_t, int32_t>& counts) {
  SamplingState s;
  s.params = &p;
  s.seed = seed;
  s.output_index = static_cast<int>(out.size());
  s.output_counts = &counts;
  s.min_tokens_masked = kEos;
  return s;
}

// What sequential sampling gives from `out`: n tokens, each with the ones before counted.
std::vector<int32_t> sequential(const SamplingParams& p, uint64_t seed, std::vector<int32_t> out, int n) {
  HostSampler sampler;
  std::unordered_map<int32_t, int32_t> counts;
  for (int32_t t : out) ++counts[t];
  for (int i = 0; i < n; ++i) {
    const int32_t t = sampler.sample(toy_logits(out), state_after(p, seed, out, counts));
    out.push_back(t);
    ++counts[t];
  }
  return out;
}

// The verifier on given rows (greedy drafter).
VerifiedTokens verify_rows(const SamplingState& s, const std::vector<float>& logits, const std::vector<int32_t>& drafts,
                           RejectionMethod method = RejectionMethod::kStandard) {
  SpeculativeVerifier verifier;
  SpeculativeStep step;
  step.state = &s;
  step.logits = logits;
  step.vocab = kVocab;
  step.drafts = drafts;
  step.method = method;
  return verifier.verify(step);
}

// One verification of `drafts` after `out` (greedy drafter), with the rows the target computes.
VerifiedTokens verify(const SamplingParams& p, uint64_t seed, const std::vector<int32_t>& out,
                      const std::vector<int32_t>& drafts, RejectionMethod method = RejectionMethod::kStandard) {
  std::unordered_map<int32_t, int32_t> counts;
  for (int32_t t : out) ++counts[t];
  const SamplingState s = state_after(p, seed, out, counts);
  std::vector<float> logits;
  std::vector<int32_t> prefix = out;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const std::vector<float> row = toy_logits(prefix);
    logits.insert(logits.end(), row.begin(), row.end());
    if (i < drafts.size()) prefix.push_back(drafts[i]);
  }
  return verify_rows(s, logits, drafts, method);
}

TEST(SpeculativeVerify, GreedyWithPenaltiesKeepsTheSequentialTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 1.5f;  // strong enough that the drafts before a row change its argmax
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> out{1, 2};
  const std::vector<int32_t> want = sequential(p, 0, out, 5);
  SamplingParams plain = p;
  plain.frequency_penalty = 0.0f;
  plain.repetition_penalty = 1.0f;
  ASSERT_NE(want, sequential(plain, 0, out, 5)) << "the penalties must matter for this test to test them";
  const std::vector<int32_t> drafts(want.begin() + 2, want.begin() + 6);  // the next 4, right
  for (RejectionMethod m : {RejectionMethod::kStandard, RejectionMethod::kBlock}) {
    const VerifiedTokens all = verify(p, 0, out, drafts, m);
    EXPECT_EQ(all.accepted, 4);
    EXPECT_EQ(all.tokens, std::vector<int32_t>(want.begin() + 2, want.end()));  // and the bonus
    std::vector<int32_t> wrong = drafts;
    wrong[2] = (wrong[2] + 1) % kVocab;
    const VerifiedTokens some = verify(p, 0, out, wrong, m);
    EXPECT_EQ(some.accepted, 2);
    EXPECT_EQ(some.tokens, std::vector<int32_t>(want.begin() + 2, want.begin() + 5));  // the correction
  }
}

TEST(SpeculativeVerify, MinTokensMasksTheDraftedStopToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 2;
  // eos (6) drafted at output index 0 and 1 is masked there: rejected, whatever the logits.
  for (int at = 0; at < 2; ++at) {
    std::vector<int32_t> drafts = sequential(p, 0, {}, 3);
    drafts[static_cast<size_t>(at)] = 6;
    const VerifiedTokens r = verify(p, 0, {}, drafts);
    EXPECT_EQ(r.accepted, at);
    EXPECT_NE(r.tokens.back(), 6);
  }
}

TEST(SpeculativeVerify, ARejectedImpossibleDraftDrawsAsTheSamplerWould) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 3;  // most tokens impossible
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<int32_t> out{3};
    const std::vector<int32_t> next = sequential(p, seed, out, 1);
    // A draft outside the top 3 has p = 0: the correction is the ordinary draw at that index.
    const std::vector<float> row = toy_logits(out);
    int32_t worst = 0;
    for (int32_t i = 1; i < kVocab; ++i)
      if (row[i] < row[worst]) worst = i;
    const VerifiedTokens r = verify(p, seed, out, {worst, 0, 0});
    ASSERT_EQ(r.accepted, 0);
    EXPECT_EQ(r.tokens[0], next[1]) << seed;
  }
}

TEST(SpeculativeVerify, RowsMustMatchTheDrafts) {
  SamplingParams p;
  SamplingState s;
  s.params = &p;
  std::vector<float> logits(kVocab * 2);
  const std::vector<int32_t> drafts{1, 2};  // needs 3 rows
  EXPECT_THROW(verify_rows(s, logits, drafts), Error);
}

}  // namespace
}  // namespace m3
