// --speculative-config: the seed's values parse; every wrong key or value is an error naming it.
#include "engine/speculative_config.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace m3 {
namespace {

std::string error_of(const std::string& json) {
  try {
    parse_speculative_config(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpeculativeConfig, SeedLinesParse) {
  const SpeculativeConfig a = parse_speculative_config(
      R"({"method":"dspark","num_speculative_tokens":7,"attention_backend":"FLASHINFER_TS",)"
      R"("kv_cache_dtype":"fp8","draft_sample_method":"probabilistic"})");
  EXPECT_EQ(a.method, "dspark");
  EXPECT_EQ(a.num_speculative_tokens, 7);
  EXPECT_TRUE(a.probabilistic_drafts);
  EXPECT_EQ(a.rejection, RejectionMethod::kStandard);
  ASSERT_TRUE(a.kv_cache_dtype.has_value());
  EXPECT_EQ(*a.kv_cache_dtype, KvDType::kFP8);
  EXPECT_EQ(a.attention_backend, "FLASHINFER_TS");
  EXPECT_TRUE(a.model.empty());
  EXPECT_EQ(a.summary(), "dspark, k=7, probabilistic drafts, standard verification, fp8_e4m3 drafter cache");

  const SpeculativeConfig b = parse_speculative_config(R"({"method":"dspark","num_speculative_tokens":3})");
  EXPECT_FALSE(b.probabilistic_drafts);
  EXPECT_FALSE(b.kv_cache_dtype.has_value());
}

TEST(SpeculativeConfig, RejectionMethods) {
  EXPECT_EQ(parse_speculative_config(
                R"({"method":"dspark","num_speculative_tokens":7,"rejection_sample_method":"block"})")
                .rejection,
            RejectionMethod::kBlock);
  const SpeculativeConfig s = parse_speculative_config(
      R"({"method":"dspark","num_speculative_tokens":7,"rejection_sample_method":"synthetic",)"
      R"("synthetic_acceptance_length":3.2})");
  EXPECT_EQ(s.rejection, RejectionMethod::kSynthetic);
  EXPECT_EQ(s.synthetic_rates, (std::vector<float>{1, 1, 0.2f, 0, 0, 0, 0}));
  const SpeculativeConfig r = parse_speculative_config(
      R"({"method":"dspark","num_speculative_tokens":2,"rejection_sample_method":"synthetic",)"
      R"("synthetic_acceptance_rates":[0.9,0.5]})");
  EXPECT_EQ(r.synthetic_rates, (std::vector<float>{0.9f, 0.5f}));
}

TEST(SpeculativeConfig, Ngram) {
  const SpeculativeConfig a = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":4})");
  EXPECT_EQ(a.method, "ngram");
  EXPECT_EQ(a.prompt_lookup_min, 5);
  EXPECT_EQ(a.prompt_lookup_max, 5);
  EXPECT_EQ(a.summary(), "ngram, k=4, n-grams of 5 to 5 tokens, standard verification");
  const SpeculativeConfig b =
      parse_speculative_config(R"({"method":"[ngram]","num_speculative_tokens":3,"prompt_lookup_max":4})");
  EXPECT_EQ(b.method, "ngram");
  EXPECT_EQ(b.prompt_lookup_min, 4);
  EXPECT_EQ(b.prompt_lookup_max, 4);
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":6,)"
      R"("rejection_sample_method":"block"})");
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 6);
  EXPECT_EQ(c.rejection, RejectionMethod::kBlock);
  EXPECT_EQ(parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2})")
                .prompt_lookup_max,
            2);
  EXPECT_NE(error_of(R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":4,"prompt_lookup_max":2})")
                .find("prompt_lookup_min 4 is above prompt_lookup_max 2"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":0})").find("prompt_lookup_min"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"ngram","num_speculative_tokens":3,"model":"x"})").find("model does not apply"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"prompt_lookup_max":3})")
                .find("prompt_lookup_max applies to method ngram only"),
            std::string::npos);
}

TEST(SpeculativeConfig, DisableByBatchSize) {
  const SpeculativeConfig c =
      parse_speculative_config(R"({"method":"dspark","num_speculative_tokens":7,"disable_by_batch_size":4})");
  ASSERT_TRUE(c.disable_by_batch_size.has_value());
  EXPECT_EQ(*c.disable_by_batch_size, 4);
  EXPECT_EQ(c.summary(), "dspark, k=7, greedy drafts, standard verification, float32 drafter cache, off above 4 running requests");
  EXPECT_NE(error_of(R"({"method":"ngram","num_speculative_tokens":3,"disable_by_batch_size":0})").find("disable_by_batch_size"),
            std::string::npos);
}

TEST(SpeculativeConfig, AdaptiveVerification) {
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method":"dspark","num_speculative_tokens":7,"draft_sample_method":"probabilistic","enable_adaptive_verification":true})");
  EXPECT_TRUE(c.adaptive_verification);
  EXPECT_EQ(c.summary(), "dspark, k=7, probabilistic drafts, adaptive standard verification, float32 drafter cache");
  EXPECT_FALSE(parse_speculative_config(
                   R"({"method":"ngram","num_speculative_tokens":3,"enable_adaptive_verification":false})")
                   .adaptive_verification);
  EXPECT_NE(error_of(R"({"method":"ngram","num_speculative_tokens":3,"enable_adaptive_verification":true})")
                .find("enable_adaptive_verification needs method dspark"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":1})")
                .find("must be true or false"),
            std::string::npos);
}

TEST(SpeculativeConfig, ErrorsNameTheKey) {
  EXPECT_NE(error_of("[1]").find("JSON object"), std::string::npos);
  EXPECT_NE(error_of("{").find("JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"method":"eagle3","num_speculative_tokens":3})").find("method 'eagle3'"), std::string::npos);
  EXPECT_NE(error_of(R"({"num_speculative_tokens":3})").find("method ''"), std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"enforce_eager":true})").find("'enforce_eager'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark"})").find("num_speculative_tokens is required"), std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":0})").find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":"7"})").find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"beam"})")
                .find("draft_sample_method 'beam'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"rejection_sample_method":"typical"})")
                .find("rejection_sample_method 'typical'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"synthetic_acceptance_length":2})")
                .find("need rejection_sample_method synthetic"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"rejection_sample_method":"synthetic"})")
                .find("exactly one"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"rejection_sample_method":"synthetic",)"
                     R"("synthetic_acceptance_length":5})")
                .find("outside [1, 4]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"rejection_sample_method":"synthetic",)"
                     R"("synthetic_acceptance_rates":[0.5,0.5]})")
                .find("list of 3 rates"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":2,"rejection_sample_method":"synthetic",)"
                     R"("synthetic_acceptance_rates":[0.5,1.5]})")
                .find("1.5"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"kv_cache_dtype":"int4"})")
                .find("kv_cache_dtype"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method":"dspark","num_speculative_tokens":3,"model":7})").find("model must be a string"),
            std::string::npos);
}

}  // namespace
}  // namespace m3
