// The logprobs reference (ops/sampling.h row_logprobs_reference, logprobs_batch_reference): the
// log_softmax of the raw row, ranks, the top k against a full sort (ties by lower id, NaN last),
// drawn tokens taken from the batch's draw, and bad rows named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/sampling.h"

namespace m3 {
namespace {

double log_sum_exp(const std::vector<float>& x) {
  double z = 0.0;
  for (float v : x) z += std::exp(static_cast<double>(v));
  return std::log(z);
}

TEST(RowLogprobsReference, LogSoftmaxOfTheRawRowWithRanksAndTopK) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const double log_z = log_sum_exp(logits);
  RowLogprobs r;
  row_logprobs_reference(logits.data(), 4, 3, {2, 1}, r);
  EXPECT_EQ(r.token[0], 2);
  EXPECT_EQ(r.token[1], 1);
  EXPECT_NEAR(r.logprob[0], 2.0 - log_z, 1e-6);
  EXPECT_NEAR(r.logprob[1], 3.0 - log_z, 1e-6);
  EXPECT_EQ(r.rank[0], 3);
  EXPECT_EQ(r.rank[1], 1);  // a tie is not "strictly larger"
  ASSERT_EQ(r.num_top, 3);
  EXPECT_EQ(r.top_id[0], 1);  // tie between 1 and 3: lower id first
  EXPECT_EQ(r.top_id[1], 3);
  EXPECT_EQ(r.top_id[2], 2);
  EXPECT_NEAR(r.top_logprob[0], 3.0 - log_z, 1e-6);
  row_logprobs_reference(logits.data(), 4, 0, {-1, -1}, r);
  EXPECT_EQ(r.num_top, 0);
  EXPECT_EQ(r.token[0], -1);
  EXPECT_EQ(r.rank[0], 0);
}

TEST(RowLogprobsReference, TopKInOnePassIsAFullSortsFirstK) {
  // Rows with many ties (logits on a grid of 8 values) and k from 0 to past the vocabulary.
  std::mt19937 rng(7);
  for (int vocab : {1, 5, 64, 1000}) {
    std::vector<float> logits(vocab);
    for (float& x : logits) x = static_cast<float>(rng() % 8) * 0.5f - 2.0f;
    std::vector<int32_t> sorted(vocab);
    std::iota(sorted.begin(), sorted.end(), 0);
    std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const double log_z = log_sum_exp(logits);
    for (int k : {0, 1, 3, 20}) {
      const int32_t token = static_cast<int32_t>(rng() % vocab);
      RowLogprobs r;
      row_logprobs_reference(logits.data(), vocab, k, {token, -1}, r);
      const int expect = std::min(k, vocab);
      ASSERT_EQ(r.num_top, expect) << vocab << " " << k;
      for (int j = 0; j < expect; ++j) {
        EXPECT_EQ(r.top_id[j], sorted[j]) << vocab << " " << k << " " << j;
        EXPECT_NEAR(r.top_logprob[j], logits[sorted[j]] - log_z, 1e-6);
      }
      EXPECT_NEAR(r.logprob[0], logits[token] - log_z, 1e-6);
      EXPECT_EQ(r.rank[0], 1 + std::count_if(logits.begin(), logits.end(), [&](float x) { return x > logits[token]; }));
    }
  }
}

TEST(RowLogprobsReference, NanRanksBelowEverything) {
  const float nan = std::nanf("");
  const std::vector<float> logits = {nan, -INFINITY, 0.5f, nan, 0.5f};
  RowLogprobs r;
  row_logprobs_reference(logits.data(), 5, 5, {-1, -1}, r);
  ASSERT_EQ(r.num_top, 5);
  EXPECT_EQ((std::vector<int32_t>(r.top_id, r.top_id + 5)), (std::vector<int32_t>{2, 4, 1, 0, 3}));
}

TEST(LogprobsBatchReference, DrawnTokensComeFromTheDrawAndBadRowsAreNamed) {
  const int32_t vocab = 6;
  std::vector<float> logits(2 * vocab);
  for (int i = 0; i < 2 * vocab; ++i) logits[i] = static_cast<float>((i * 7) % 5);
  SampleBatch batch;
  batch.rows.resize(2);
  LogprobRow q;
  q.logits_row = 1;
  q.top_k = 2;
  q.drawn_by[0] = 1;
  q.token[1] = 0;
  batch.logprobs = {q};
  const int32_t ids[2] = {4, 5};
  RowLogprobs out[1];
  logprobs_batch_reference(logits.data(), 2, vocab, batch, ids, out);
  RowLogprobs expect;
  row_logprobs_reference(logits.data() + vocab, vocab, 2, {5, 0}, expect);
  EXPECT_EQ(out[0].token[0], 5);
  EXPECT_EQ(out[0].token[1], 0);
  EXPECT_EQ(out[0].logprob[0], expect.logprob[0]);
  EXPECT_EQ(out[0].rank[1], expect.rank[1]);
  EXPECT_EQ(out[0].top_id[0], expect.top_id[0]);
  EXPECT_THROW(logprobs_batch_reference(logits.data(), 2, vocab, batch, ids, nullptr), Error);

  const auto message = [&](LogprobRow bad) {
    batch.logprobs = {bad};
    try {
      check_logprob_rows(batch, 2, vocab, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(q), "");
  LogprobRow bad = q;
  bad.logits_row = 2;
  EXPECT_NE(message(bad).find("logits row 2 of 2"), std::string::npos);
  bad = q;
  bad.top_k = kMaxTopLogprobs + 1;
  EXPECT_NE(message(bad).find("top 21"), std::string::npos);
  bad = q;
  bad.drawn_by[0] = 2;
  EXPECT_NE(message(bad).find("draw of row 2 of 2"), std::string::npos);
  bad = q;
  bad.token[1] = vocab;
  EXPECT_NE(message(bad).find("token 6"), std::string::npos);
}

}  // namespace
}  // namespace m3
