// Structured outputs in the engine: a grammar constraint (grammar/) on the fake model, whose
// unconstrained output is noise. Every sequence's text must match the grammar, end when it is
// complete (reason stop), and give the same tokens alone, batched with unconstrained requests,
// and under constant preemption; a seeded sampled request is reproducible.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine_loop.h"
#include "fake_model.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/structured_output.h"

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

std::map<std::string, Result> run(test::FakeModel& model, EngineConfig config, const std::vector<EngineRequest>& reqs) {
  std::map<std::string, Result> out;
  if (config.max_model_len == 0) config.max_model_len = 2048;
  EngineLoop loop(model, config);
  for (const EngineRequest& r : reqs) {
    loop.add(r, [&out, id = r.id](const RequestOutput& o) {
      Result& res = out[id];
      res.tokens.insert(res.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) res.reason = o.finish_reason, res.error = o.error;
    }, r.sampling.seed.value_or(0), Clock::now());
  }
  while (loop.has_work()) loop.step();
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  return out;
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

}  // namespace
}  // namespace m3
