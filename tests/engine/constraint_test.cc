// Structured outputs in the engine: a grammar constraint (grammar/) on the fake model, whose
// unconstrained output is noise. Every sequence's text must match the grammar, end when it is
// complete (reason stop), and give the same tokens alone, batched with unconstrained requests,
// and under constant preemption; a seeded sampled request is reproducible.
#include <gtest/gtest.h>

#include <map>

#include <fmt/core.h>

#include "engine/engine_loop.h"
#include "engine/speculative_config.h"
#include "fake_model.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/structured_output.h"
#include "ops/rejection_sampling.h"
#include "tests/engine/chi_square.h"
#include "tests/engine/oracle_drafter.h"
#include "tests/engine/test_drafts.h"

namespace m3 {
namespace {

constexpr int kVocab = 97;
constexpr int32_t kEos = 96;

// Tokens: 0-9 digits, 10 ',', 11 '[', 12 ']', 13 "1,", 14 "],", 15 "[1", 16 ",[", then letters; 96 eos.
std::shared_ptr<const grammar::Vocabulary> vocabulary() {
  std::vector<std::optional<std::string>> t(kVocab);
  for (int d = 0; d < 10; ++d) t[d] = std::string(1, char('0' + d));
  t[10] = ",", t[11] = "[", t[12] = "]", t[13] = "1,", t[14] = "],", t[15] = "[1", t[16] = ",[";
  for (int i = 17; i < kEos; ++i) t[i] = std::string(1, char('a' + (i - 17) % 26)) + (i >= 43 ? "x" : "");
  return std::make_shared<const grammar::Vocabulary>(t, std::vector<int32_t>{kEos});
}

std::shared_ptr<const TokenConstraintSpec> array_constraint() {
  grammar::StructuredOutputSpec spec;
  spec.kind = grammar::StructuredOutputSpec::Kind::kJsonSchema;
  spec.schema = nlohmann::ordered_json::parse(
      R"({"type":"array","items":{"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"maxItems":3},"minItems":1,"maxItems":4})");
  spec.field = "json_schema";
  auto g = std::make_shared<grammar::CompiledGrammar>(grammar::structured_output_grammar(spec), vocabulary(), "json_schema");
  return std::make_shared<grammar::GrammarConstraintSpec>(g, std::make_shared<std::vector<std::string>>(), "");
}

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  std::string error;
};

std::string text_of(const std::vector<int32_t>& tokens) {
  auto v = vocabulary();
  std::string s;
  for (int32_t t : tokens)
    if (v->bytes(t)) s += *v->bytes(t);
  return s;
}

std::map<std::string, Result> run(test::FakeModel& model, EngineConfig config, const std::vector<EngineRequest>& reqs,
                                  std::unique_ptr<Drafter> drafter = nullptr, EngineStats* stats = nullptr) {
  std::map<std::string, Result> out;
  if (config.max_model_len == 0) config.max_model_len = 2048;
  EngineLoop loop(model, config, std::move(drafter));
  for (const EngineRequest& r : reqs) {
    loop.add(r, [&out, id = r.id](const RequestOutput& o) {
      Result& res = out[id];
      res.tokens.insert(res.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) res.reason = o.finish_reason, res.error = o.error;
    }, r.sampling.seed.value_or(0), Clock::now());
  }
  while (loop.has_work()) loop.step();
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  if (stats) *stats = loop.stats();
  return out;
}

// Each JSON text a constrained request produced parses as the schema's arrays.
void expect_valid(const std::string& text) {
  const auto v = nlohmann::json::parse(text);
  ASSERT_TRUE(v.is_array() && !v.empty() && v.size() <= 4) << text;
  for (const auto& inner : v) {
    ASSERT_TRUE(inner.is_array() && inner.size() <= 3) << text;
    for (const auto& x : inner) EXPECT_TRUE(x.is_number_integer() && x.get<int>() >= 0 && x.get<int>() <= 99) << text;
  }
}

std::vector<EngineRequest> requests(int n, bool constrained_only) {
  auto spec = array_constraint();
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    for (int j = 0; j < 3 + i % 20; ++j) r.prompt_token_ids.push_back((i * 7 + j * 3) % kVocab);
    r.sampling.max_tokens = 60;
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 0.8f;
    r.sampling.seed = 1000 + i;
    r.eos_token_ids = {kEos};
    if (constrained_only || i % 2 == 0) r.sampling.constraint = spec;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(EngineConstraint, EveryConstrainedOutputIsValidAndEndsWhenComplete) {
  test::FakeModel model(8, 2048, kVocab);
  auto reqs = requests(40, false);
  auto out = run(model, {}, reqs);
  int constrained = 0;
  for (const EngineRequest& r : reqs) {
    const Result& res = out[r.id];
    if (!r.sampling.constraint) {
      EXPECT_TRUE(res.reason == FinishReason::kLength || res.reason == FinishReason::kStop) << r.id;  // noise
      continue;
    }
    ++constrained;
    ASSERT_EQ(res.reason, FinishReason::kStop) << r.id << " " << res.error << " " << text_of(res.tokens);
    const auto v = nlohmann::json::parse(text_of(res.tokens));
    ASSERT_TRUE(v.is_array() && !v.empty() && v.size() <= 4) << text_of(res.tokens);
    for (const auto& inner : v) {
      ASSERT_TRUE(inner.is_array() && inner.size() <= 3);
      for (const auto& x : inner) EXPECT_TRUE(x.is_number_integer() && x.get<int>() >= 0 && x.get<int>() <= 99);
    }
  }
  EXPECT_EQ(constrained, 20);
}

TEST(EngineConstraint, SameTokensAloneBatchedAndUnderPreemption) {
  auto reqs = requests(24, true);
  test::FakeModel big(8, 2048, kVocab);
  auto batched = run(big, {}, reqs);
  for (int i = 0; i < 24; i += 5) {
    test::FakeModel alone_model(8, 2048, kVocab);
    auto alone = run(alone_model, {}, {reqs[size_t(i)]});
    EXPECT_EQ(alone[reqs[size_t(i)].id].tokens, batched[reqs[size_t(i)].id].tokens) << i;
  }
  test::FakeModel tiny(8, 12, kVocab);
  EngineConfig config;
  config.max_num_seqs = 12;
  config.max_num_batched_tokens = 40;
  config.max_model_len = 96;
  auto squeezed = run(tiny, config, reqs);
  for (const EngineRequest& r : reqs) {
    EXPECT_EQ(squeezed[r.id].tokens, batched[r.id].tokens) << r.id;
    EXPECT_EQ(squeezed[r.id].reason, FinishReason::kStop) << r.id << " " << squeezed[r.id].error;
  }
  // Greedy under a constraint is deterministic run to run.
  test::FakeModel again(8, 2048, kVocab);
  auto rerun = run(again, {}, reqs);
  for (const EngineRequest& r : reqs) EXPECT_EQ(rerun[r.id].tokens, batched[r.id].tokens) << r.id;
}

TEST(EngineConstraint, MaxTokensAwareMasksFinishInTime) {
  auto reqs = requests(12, true);
  for (auto& r : reqs) r.sampling.max_tokens = 12;  // "[[1],[2]]"-sized budgets
  test::FakeModel model(8, 2048, kVocab);
  auto out = run(model, {}, reqs);
  for (const EngineRequest& r : reqs) {
    EXPECT_EQ(out[r.id].reason, FinishReason::kStop) << r.id << " " << text_of(out[r.id].tokens);
    EXPECT_NO_THROW(nlohmann::json::parse(text_of(out[r.id].tokens)));
  }
}

// Speculative decoding under a constraint: each verification row is masked as the constraint stands
// after the drafts before it, and drafts the grammar refuses are cut before the model sees them.
// Greedy and seeded requests give plain decoding's text (the drafter is wrong a quarter of the
// time, and its wrong guesses are often no valid continuation), drafts are kept; block
// verification (on the host, with the same masks) and synthetic acceptance (which keeps drafts
// without comparing) yield valid texts.
TEST(EngineConstraint, SpeculativeDecodingKeepsTheConstrainedText) {
  for (const bool constrained_only : {true, false}) {
    const auto reqs = requests(24, constrained_only);
    test::FakeModel plain_model(8, 2048, kVocab);
    auto reference = run(plain_model, {}, reqs);
    test::OracleDrafter::Known known;
    for (const EngineRequest& r : reqs) known.push_back({r.prompt_token_ids, reference[r.id].tokens});
    for (int k : {1, 3, 7}) {
      EngineConfig config;
      config.speculative = parse_speculative_config(fmt::format(R"({{"method":"ngram","num_speculative_tokens":{}}})", k));
      test::FakeModel model(8, 2048, kVocab);
      EngineStats stats;
      auto out = run(model, config, reqs, std::make_unique<test::OracleDrafter>(known, kVocab), &stats);
      for (const EngineRequest& r : reqs) {
        EXPECT_EQ(out[r.id].tokens, reference[r.id].tokens) << "k=" << k << " " << r.id;
        EXPECT_EQ(out[r.id].reason, reference[r.id].reason) << "k=" << k << " " << r.id << " " << out[r.id].error;
      }
      EXPECT_GT(stats.spec_num_drafts, 0u) << "k=" << k;
      EXPECT_GT(stats.spec_num_accepted_tokens, 0u) << "k=" << k;
      if (constrained_only)
        std::printf("[constraint spec] k=%d: %llu of %llu drafts kept\n", k,
                    static_cast<unsigned long long>(stats.spec_num_accepted_tokens),
                    static_cast<unsigned long long>(stats.spec_num_draft_tokens));
    }
  }
  // Block verification runs on the host with the same masks: greedy requests give plain decoding's
  // text (the target is one-hot), sampled ones valid texts (their draws are the verifier's).
  {
    const auto reqs = requests(24, true);
    test::FakeModel plain_model(8, 2048, kVocab);
    auto reference = run(plain_model, {}, reqs);
    test::OracleDrafter::Known known;
    for (const EngineRequest& r : reqs) known.push_back({r.prompt_token_ids, reference[r.id].tokens});
    EngineConfig config;
    config.speculative =
        parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":3,"rejection_sample_method":"block"})");
    test::FakeModel model(8, 2048, kVocab);
    EngineStats stats;
    auto out = run(model, config, reqs, std::make_unique<test::OracleDrafter>(known, kVocab), &stats);
    for (const EngineRequest& r : reqs) {
      ASSERT_EQ(out[r.id].reason, FinishReason::kStop) << r.id << " " << out[r.id].error;
      expect_valid(text_of(out[r.id].tokens));
      if (r.sampling.temperature == 0.0f) EXPECT_EQ(out[r.id].tokens, reference[r.id].tokens) << "block " << r.id;
    }
    EXPECT_GT(stats.spec_num_accepted_tokens, 0u);
  }
  const auto reqs = requests(16, true);
  EngineConfig config;
  config.speculative = parse_speculative_config(
      R"({"method":"ngram","num_speculative_tokens":3,"rejection_sample_method":"synthetic","synthetic_acceptance_length":3.0})");
  test::FakeModel model(8, 2048, kVocab);
  test::OracleDrafter::Known known;
  for (const EngineRequest& r : reqs) known.push_back({r.prompt_token_ids, {}});
  auto out = run(model, config, reqs, std::make_unique<test::OracleDrafter>(known, kVocab));
  for (const EngineRequest& r : reqs) {
    ASSERT_EQ(out[r.id].reason, FinishReason::kStop) << r.id << " " << out[r.id].error << " " << text_of(out[r.id].tokens);
    expect_valid(text_of(out[r.id].tokens));
  }
}

// A drafter that follows constraints (Drafter::follows_constraints) with poor guesses: draft j comes
// from the fake model's logits after an unrelated context, under the constraint's mask after
// drafts [0, j); greedy requests get the best allowed token, sampled ones a draw at their
// temperature with the distribution it came from (probabilistic drafts).
class MaskedNoiseDrafter final : public Drafter {
 public:
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override {
    drafts.assign(requests.size(), Draft());
    std::vector<float> logits(kVocab);
    for (size_t i = 0; i < requests.size(); ++i) {
      const DraftRequest& r = requests[i];
      SampleBatch batch = test::test_draft_batch(r);
      batch.allowed_words = token_mask_words(kVocab);
      batch.add_allowed_row(batch.allowed_words);
      std::optional<DraftConstraintWalk> walk;
      if (r.constraint) walk.emplace(*r.constraint, r.remaining_tokens);
      SampleWorkspace ws;
      for (int j = 0; j < r.max_drafts; ++j) {
        if (walk && walk->terminated()) break;
        batch.rows[0].allowed_row = walk && walk->next_mask(batch.allowed) ? 0 : -1;
        test::fake_logits({7777, static_cast<int32_t>(r.tokens.size()), j}, kVocab, logits.data());
        const int32_t id = test::draw_test_draft(r, j, logits.data(), kVocab, batch, ws, drafts[i]);
        if (walk && !walk->accept(id)) {
          if (!drafts[i].rows.empty() && drafts[i].rows.size() > drafts[i].tokens.size()) drafts[i].rows.pop_back();
          break;
        }
        drafts[i].tokens.push_back(id);
      }
    }
  }
  bool follows_constraints() const override { return true; }
};

// Probabilistic drafts under a constraint, from a drafter that draws them under the constraint's
// masks: greedy requests keep plain decoding's text, and sampled requests' tokens are distributed
// as without speculation (two-sample chi-square over 1,500 seeds, standard and block verification),
// although the drafter's distribution is not the target's.
TEST(EngineConstraint, ProbabilisticDraftsUnderTheConstraintsMasksKeepTheDistribution) {
  auto spec = array_constraint();
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 1504; ++i) {
    EngineRequest r;
    r.id = "p" + std::to_string(i);
    r.prompt_token_ids = {3, 1, 4, 1, 5};
    r.sampling.max_tokens = 16;
    r.sampling.temperature = i < 4 ? 0.0f : 1.0f;
    r.sampling.seed = 7000 + i;
    r.sampling.constraint = spec;
    r.eos_token_ids = {kEos};
    reqs.push_back(std::move(r));
  }
  for (int i = 0; i < 4; ++i) reqs[size_t(i)].prompt_token_ids.push_back(10 + i);  // four greedy texts
  EngineConfig plain_config;
  plain_config.max_num_seqs = 64;
  test::FakeModel plain_model(8, 4096, kVocab);
  auto reference = run(plain_model, plain_config, reqs);
  for (const char* method : {"standard", "block"}) {
    EngineConfig config = plain_config;
    config.speculative = parse_speculative_config(fmt::format(
        R"({{"method":"ngram","num_speculative_tokens":3,"rejection_sample_method":"{}"}})", method));
    test::FakeModel model(8, 4096, kVocab);
    EngineStats stats;
    auto out = run(model, config, reqs, std::make_unique<MaskedNoiseDrafter>(), &stats);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(out[reqs[size_t(i)].id].tokens, reference[reqs[size_t(i)].id].tokens) << method << " greedy " << i;
    for (const EngineRequest& r : reqs) {
      ASSERT_EQ(out[r.id].reason, FinishReason::kStop) << method << " " << r.id << " " << out[r.id].error;
      expect_valid(text_of(out[r.id].tokens));
    }
    EXPECT_GT(stats.spec_num_draft_tokens, 1000u) << method;
    EXPECT_GT(stats.spec_num_accepted_tokens, 100u) << method;
    for (size_t pos = 1; pos < 7; ++pos) {
      std::vector<int32_t> a, b;  // -1: the text ended before
      for (size_t i = 4; i < reqs.size(); ++i) {
        const auto& want = reference[reqs[i].id].tokens;
        const auto& got = out[reqs[i].id].tokens;
        a.push_back(pos < want.size() ? want[pos] : -1);
        b.push_back(pos < got.size() ? got[pos] : -1);
      }
      const auto [stat, df] = test::two_sample_chi_square(a, b);
      const double critical = test::chi_square_critical_1e4(df);
      std::printf("[constraint spec] masked probabilistic drafts, %s: token %zu chi-square %.1f, %d df (critical %.1f)\n",
                  method, pos, stat, df, critical);
      EXPECT_LT(stat, critical) << method << " token " << pos;
    }
    std::printf("[constraint spec] masked probabilistic drafts, %s: %llu of %llu drafts kept\n", method,
                static_cast<unsigned long long>(stats.spec_num_accepted_tokens),
                static_cast<unsigned long long>(stats.spec_num_draft_tokens));
  }
}

}  // namespace
}  // namespace m3
