// Speculative decoding through the engine on real MiniMax-M3 checkpoints (CPU): with any drafter,
// greedy requests and seeded sampled ones (standard verification of one-hot drafts) give exactly
// the tokens, stop reasons and logprobs of decoding without speculation, at k = 1, 3 and 7, alone
// and in batches of 16, with preemption forced and with prefix-cache hits on blocks that
// speculative steps filled; synthetic verification reaches the requested acceptance length.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "engine/drafter.h"
#include "engine/engine_loop.h"
#include "engine/minimax_m3_runner.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/structured_output.h"
#include "model/dspark.h"
#include "text/tokenizer.h"
#include "tests/engine/chi_square.h"
#include "tests/engine/oracle_drafter.h"
#include "tests/engine/real_model.h"

namespace m3 {
namespace {

// Requests whose prompts repeat a segment (so prompt lookup finds matches), with penalties,
// min_tokens, stop ids and logprobs spread over them.
std::vector<EngineRequest> workload(int vocab, int n, float temperature) {
  std::vector<EngineRequest> reqs;
  for (int r = 0; r < n; ++r) {
    EngineRequest req;
    req.id = fmt::format("s{}", r);
    std::vector<int32_t> segment(6 + r % 9);
    for (size_t i = 0; i < segment.size(); ++i) segment[i] = 3 + static_cast<int32_t>(mix(r * 97 + i) % (vocab - 3));
    for (int rep = 0; rep < 2 + r % 3; ++rep) req.prompt_token_ids.insert(req.prompt_token_ids.end(), segment.begin(), segment.end());
    req.prompt_token_ids.push_back(3 + static_cast<int32_t>(mix(r) % (vocab - 3)));
    SamplingParams& p = req.sampling;
    p.max_tokens = 8 + static_cast<int>(mix(r + 500) % 40);
    p.temperature = temperature;
    p.top_p = 0.95f;
    p.seed = 77 + r;
    if (r % 5 == 1) p.repetition_penalty = 1.3f;
    if (r % 5 == 2) p.frequency_penalty = 0.5f, p.presence_penalty = 0.2f;
    if (r % 5 == 3) {
      p.min_tokens = 4;
      for (int i = 0; i < 10; ++i) p.stop_token_ids.push_back(3 + static_cast<int32_t>(mix(r * 7 + i) % (vocab - 3)));
    }
    if (r % 4 == 0) p.logprobs = 2;
    reqs.push_back(std::move(req));
  }
  return reqs;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<PositionLogprobs> logprobs;
  FinishReason reason = FinishReason::kNone;
  int cached = 0;
};
using Results = std::map<std::string, Result>;

Results run(ModelRunner& runner, EngineConfig config, const std::vector<EngineRequest>& reqs, bool one_at_a_time,
            std::unique_ptr<Drafter> drafter = nullptr, EngineStats* stats = nullptr) {
  config.max_model_len = 1024;
  EngineLoop loop(runner, config, std::move(drafter));
  Results results;
  auto add = [&](const EngineRequest& r) {
    loop.add(r, [&results, id = r.id](const RequestOutput& out) {
      Result& res = results[id];
      EXPECT_EQ(out.logprobs.size(), out.logprobs.empty() ? 0 : out.new_token_ids.size()) << id;
      res.tokens.insert(res.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      res.logprobs.insert(res.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      if (out.finished) {
        EXPECT_TRUE(out.error.empty()) << id << ": " << out.error;
        res.reason = out.finish_reason;
        res.cached = out.num_cached_prompt_tokens;
      }
    }, *r.sampling.seed, Clock::now());
  };
  drive(loop, reqs, one_at_a_time, add);
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  if (stats) *stats = loop.stats();
  return results;
}

void expect_same(const Results& reference, const Results& other, const std::string& what) {
  ASSERT_EQ(reference.size(), other.size()) << what;
  for (const auto& [id, r] : reference) {
    const Result& o = other.at(id);
    EXPECT_EQ(r.tokens, o.tokens) << what << ": request " << id;
    EXPECT_EQ(r.reason, o.reason) << what << ": request " << id;
    ASSERT_EQ(r.logprobs.size(), o.logprobs.size()) << what << ": request " << id;
    for (size_t i = 0; i < r.logprobs.size(); ++i) {
      EXPECT_EQ(r.logprobs[i].token_id, o.logprobs[i].token_id) << what << ": " << id << " at " << i;
      EXPECT_EQ(r.logprobs[i].logprob, o.logprobs[i].logprob) << what << ": " << id << " at " << i;
      EXPECT_EQ(r.logprobs[i].rank, o.logprobs[i].rank) << what << ": " << id << " at " << i;
    }
  }
}

// The oracle drafter (tests/engine/oracle_drafter.h) of these requests' reference outputs.
std::unique_ptr<Drafter> oracle(const std::vector<EngineRequest>& reqs, const Results& reference, int vocab) {
  test::OracleDrafter::Known known;
  for (const EngineRequest& r : reqs) known.push_back({r.prompt_token_ids, reference.at(r.id).tokens});
  return std::make_unique<test::OracleDrafter>(std::move(known), vocab);
}

SpeculativeConfig spec_config(const std::string& json) { return parse_speculative_config(json); }

void check_speculation(const std::filesystem::path& dir, KvDType kv, DType activations, float temperature) {
  Loaded m = load(dir, kv, 400, activations);
  MiniMaxM3Runner runner(*m.model);
  const int vocab = runner.vocab_size();
  const auto reqs = workload(vocab, 24, temperature);

  EngineConfig plain;
  plain.enable_prefix_caching = false;
  const Results reference = run(runner, plain, reqs, true);

  for (int k : {1, 3, 7}) {
    EngineConfig alone = plain;
    alone.speculative = spec_config(fmt::format(R"({{"method":"ngram","num_speculative_tokens":{},"prompt_lookup_min":2,"prompt_lookup_max":4}})", k));
    EngineStats ngram_stats;
    expect_same(reference, run(runner, alone, reqs, true, nullptr, &ngram_stats), fmt::format("ngram k={} alone", k));
    EXPECT_GT(ngram_stats.spec_num_drafts, 0u) << "the prompts repeat: prompt lookup must find something";

    EngineConfig batch = alone;
    batch.max_num_seqs = 16;
    batch.max_num_batched_tokens = 96;
    EngineStats oracle_stats;
    expect_same(reference, run(runner, batch, reqs, false, oracle(reqs, reference, vocab), &oracle_stats),
                fmt::format("oracle k={} batch of 16", k));
    // Some steps keep every draft, some none.
    ASSERT_EQ(oracle_stats.spec_accepted_per_pos.size(), static_cast<size_t>(k));
    EXPECT_GT(oracle_stats.spec_num_accepted_tokens, 0u);
    EXPECT_LT(oracle_stats.spec_num_accepted_tokens, oracle_stats.spec_num_draft_tokens);
    EXPECT_GT(oracle_stats.spec_accepted_per_pos[static_cast<size_t>(k - 1)], 0u);
    std::printf("[spec e2e] k=%d: ngram %llu/%llu drafts kept, oracle %llu/%llu (length %.2f)\n", k,
                static_cast<unsigned long long>(ngram_stats.spec_num_accepted_tokens),
                static_cast<unsigned long long>(ngram_stats.spec_num_draft_tokens),
                static_cast<unsigned long long>(oracle_stats.spec_num_accepted_tokens),
                static_cast<unsigned long long>(oracle_stats.spec_num_draft_tokens),
                1.0 + double(oracle_stats.spec_num_accepted_tokens) / double(oracle_stats.spec_num_drafts));

    SmallPoolRunner small(runner, 30);  // 240 tokens of KV for 16 running requests
    EngineStats small_stats;
    expect_same(reference, run(small, batch, reqs, false, oracle(reqs, reference, vocab), &small_stats),
                fmt::format("oracle k={} forced preemption", k));
    EXPECT_GT(small_stats.num_preemptions, 0u);

    // Prefix caching: the blocks speculative steps filled are registered and read back by the
    // requests after them (the same prompts again, with their outputs appended).
    EngineConfig cached = batch;
    cached.enable_prefix_caching = true;
    std::vector<EngineRequest> again = reqs;
    for (EngineRequest& r : again) {
      const std::vector<int32_t>& out = reference.at(r.id).tokens;
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), out.begin(), out.end() - 1);
      r.id += "-again";
      r.sampling.max_tokens = 4;
    }
    const Results again_reference = run(runner, plain, again, true);
    std::vector<EngineRequest> both = reqs;
    both.insert(both.end(), again.begin(), again.end());
    Results both_reference = reference;
    both_reference.insert(again_reference.begin(), again_reference.end());
    EngineStats cache_stats;
    const Results hits = run(runner, cached, both, true, oracle(both, both_reference, vocab), &cache_stats);
    expect_same(both_reference, hits, fmt::format("oracle k={} prefix-cache hits", k));
    EXPECT_GT(cache_stats.prefix_cache_hits_tokens, 0u);
  }

  // Block verification of a greedy target keeps the greedy text too.
  if (temperature == 0.0f) {
    EngineConfig block = plain;
    block.max_num_seqs = 16;
    block.speculative = spec_config(R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"rejection_sample_method":"block"})");
    expect_same(reference, run(runner, block, reqs, false, oracle(reqs, reference, vocab)),
                "block verification, batch of 16");
  }
}

TEST(SpeculativeEngine, GreedyIdenticalToPlainDecoding) {
  check_speculation(kSparse, KvDType::kF32, DType::kF32, 0.0f);
}

TEST(SpeculativeEngine, SeededSamplingIdenticalToPlainDecoding) {
  check_speculation(kSparse, KvDType::kF32, DType::kF32, 0.8f);
}

TEST(SpeculativeEngine, GreedyIdenticalWithNvfp4KvOnMixedModel) {
  check_speculation(kMixed, KvDType::kNVFP4, DType::kBF16, 0.0f);
}

// Synthetic verification keeps drafts at the requested rates whatever they are: the mean
// acceptance length (vLLM's, counting the target's token) is the requested one within 2%.
TEST(SpeculativeEngine, SyntheticReachesTheRequestedAcceptanceLength) {
  Loaded m = load(kSparse, KvDType::kF32, 1200, DType::kF32);
  MiniMaxM3Runner runner(*m.model);
  const int vocab = runner.vocab_size();
  std::vector<EngineRequest> reqs = workload(vocab, 16, 0.0f);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams& p = reqs[i].sampling;
    p = SamplingParams();
    p.temperature = 0.0f;
    p.max_tokens = 500;
    p.ignore_eos = true;
    p.seed = 1000 + i;  // the acceptance draws are per request: distinct seeds, independent draws
  }
  EngineConfig config;
  config.max_num_seqs = 16;
  for (const char* json : {R"({"method":"ngram","num_speculative_tokens":7,"rejection_sample_method":"synthetic","synthetic_acceptance_length":3.2})",
                           R"({"method":"ngram","num_speculative_tokens":3,"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[0.9,0.8,0.7]})"}) {
    config.speculative = spec_config(json);
    Results empty;
    for (const EngineRequest& r : reqs) empty[r.id] = Result();
    EngineStats stats;
    const Results out = run(runner, config, reqs, false, oracle(reqs, empty, vocab), &stats);
    for (const auto& [id, r] : out) EXPECT_EQ(r.tokens.size(), 500u) << id;
    // The last steps of a request have fewer drafts (max_tokens), a bias of under 1% here.
    const double length = 1.0 + double(stats.spec_num_accepted_tokens) / double(stats.spec_num_drafts);
    const double want = config.speculative->num_speculative_tokens == 7 ? 3.2 : 1.0 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.7;
    std::printf("[spec e2e] synthetic: length %.3f, wanted %.3f (%llu steps)\n", length, want,
                static_cast<unsigned long long>(stats.spec_num_drafts));
    EXPECT_NEAR(length, want, 0.02 * want) << json;
  }
}

// disable_by_batch_size: no drafts while more requests than that are running; the text is the
// same, and drafting resumes as the batch drains.
TEST(SpeculativeEngine, DisableByBatchSize) {
  Loaded m = load(kSparse, KvDType::kF32, 400, DType::kF32);
  MiniMaxM3Runner runner(*m.model);
  const int vocab = runner.vocab_size();
  const auto reqs = workload(vocab, 12, 0.0f);
  EngineConfig plain;
  plain.max_num_seqs = 12;
  const Results reference = run(runner, plain, reqs, false);
  EngineConfig spec = plain;
  spec.speculative = spec_config(R"({"method":"ngram","num_speculative_tokens":3})");
  EngineStats always, limited;
  expect_same(reference, run(runner, spec, reqs, false, oracle(reqs, reference, vocab), &always),
              "always drafting");
  spec.speculative = spec_config(R"({"method":"ngram","num_speculative_tokens":3,"disable_by_batch_size":2})");
  expect_same(reference, run(runner, spec, reqs, false, oracle(reqs, reference, vocab), &limited),
              "drafting at most 2 running");
  EXPECT_GT(limited.spec_num_drafts, 0u);  // the batch's tail
  EXPECT_LT(limited.spec_num_drafts, always.spec_num_drafts);
}

// No drafter guess reaches the model past max_tokens or the model's length, and no verification
// row falls on a forced token: a request with forced_tokens drafts once they are behind it, one
// with a reasoning budget drafts up to the budget (and after the forced closer), and the text is
// plain decoding's.
TEST(SpeculativeEngine, DraftsStayWithinMaxTokensAndOffForcedTokens) {
  Loaded m = load(kSparse, KvDType::kF32, 400, DType::kF32);
  MiniMaxM3Runner runner(*m.model);
  const int vocab = runner.vocab_size();
  std::vector<EngineRequest> reqs = workload(vocab, 6, 0.0f);
  reqs[0].sampling.max_tokens = 1;
  reqs[1].sampling.max_tokens = 2;
  reqs[2].sampling.forced_tokens = {7, 8, 9};
  reqs[2].sampling.forced_after = {};
  reqs[2].sampling.max_tokens = 24;
  reqs[3].sampling.reasoning_budget = 9;  // the closer {11, 12} at outputs 9 and 10
  reqs[3].sampling.reasoning_end = {11, 12};
  reqs[3].sampling.max_tokens = 30;
  EngineConfig plain;
  const Results reference = run(runner, plain, reqs, true);
  EngineConfig spec = plain;
  spec.speculative = spec_config(R"({"method":"ngram","num_speculative_tokens":7})");
  EngineStats stats;
  expect_same(reference, run(runner, spec, reqs, true, oracle(reqs, reference, vocab), &stats),
              "max_tokens 1 and 2, forced tokens, a reasoning budget");
  EXPECT_EQ(reference.at("s0").tokens.size(), 1u);
  EXPECT_EQ(reference.at("s1").tokens.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(reference.at("s2").tokens.begin(), reference.at("s2").tokens.begin() + 3),
            (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(std::vector<int32_t>(reference.at("s3").tokens.begin() + 9, reference.at("s3").tokens.begin() + 11),
            (std::vector<int32_t>{11, 12}));
  // The forced requests alone: they draft where nothing is forced.
  for (const int r : {2, 3}) {
    EngineStats alone;
    const std::vector<EngineRequest> one = {reqs[size_t(r)]};
    Results got = run(runner, spec, one, true, oracle(one, reference, vocab), &alone);
    EXPECT_EQ(got.at(one[0].id).tokens, reference.at(one[0].id).tokens) << one[0].id;
    EXPECT_GT(alone.spec_num_accepted_tokens, 0u) << one[0].id;
  }
}

// The shipped small model on the CPU (f32), its drafter's files and the drafter's reference
// prompts (held-out code, tests/model_small/dspark_reference.json).
struct SmallModel {
  explicit SmallModel(int64_t kv_blocks, int64_t host_blocks = 0) : config(load_model_config(kDir)) {
    backend = make_cpu_backend();
    options.num_kv_blocks = kv_blocks;
    options.num_host_kv_blocks = host_blocks;
    model = std::make_unique<MiniMaxM3>(config, load_weights(config, kDir), *backend, options);
    std::ifstream in("tests/model_small/dspark_reference.json");
    reference = nlohmann::json::parse(in);
  }
  // The shipped drafter on the model's backend, reading its embedding and lm_head.
  std::unique_ptr<DSparkDrafter> drafter(KvDType cache) const {
    return load_dspark_drafter(kDir / "dspark", config, *backend, model->weights().embed, model->weights().lm_head,
                               options.num_kv_blocks, config.index_block_size, cache, options.num_host_kv_blocks);
  }
  static inline const std::filesystem::path kDir = "models/minimax-m3-small";
  ModelConfig config;
  ModelRuntimeOptions options;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
  nlohmann::json reference;
};

// The shipped small model with its DSpark drafter (models/minimax-m3-small/dspark): the drafter's
// cache follows the target's slots through batching, preemption and prefix-cache hits, and the
// text is the text without speculation.
TEST(SpeculativeEngine, DSparkDrafterOnTheSmallModel) {
  SmallModel m(24);
  const ModelConfig& config = m.config;
  MiniMaxM3& model = *m.model;
  // Prompts: pieces of the drafter's reference prompts (held-out code).
  const nlohmann::json& ref = m.reference;
  std::vector<EngineRequest> reqs;
  for (int r = 0; r < 8; ++r) {
    const auto prompt = ref["cases"][r % 4]["prompt"].get<std::vector<int32_t>>();
    EngineRequest q;
    q.id = fmt::format("d{}", r);
    const size_t len = std::min(prompt.size(), size_t(20 + 37 * r));
    q.prompt_token_ids.assign(prompt.begin(), prompt.begin() + len);
    q.sampling.max_tokens = 32 + r * 3;
    q.sampling.temperature = r % 3 == 2 ? 0.8f : 0.0f;
    q.sampling.seed = 900 + r;
    q.sampling.ignore_eos = r % 2 == 0;
    if (r % 4 == 1) q.sampling.logprobs = 1;
    q.eos_token_ids = config.eos_token_ids;
    reqs.push_back(std::move(q));
  }
  for (int k : {3, 7}) {
    MiniMaxM3Runner plain_runner(model);
    EngineConfig plain;
    plain.enable_prefix_caching = false;
    const Results reference = run(plain_runner, plain, reqs, true);

    // k = 3 with the drafter's cache in fp8 (the seed's drafter kv_cache_dtype): the drafts change
    // a little, the text not at all.
    MiniMaxM3Runner runner(model);
    runner.attach_dspark(m.drafter(k == 3 ? KvDType::kFP8 : KvDType::kF32));
    EngineConfig spec = plain;
    spec.speculative = spec_config(fmt::format(R"({{"method":"dspark","num_speculative_tokens":{}{}}})", k,
                                               k == 3 ? R"(,"kv_cache_dtype":"fp8")" : ""));
    EngineStats alone_stats;
    expect_same(reference, run(runner, spec, reqs, true, nullptr, &alone_stats), fmt::format("dspark k={} alone", k));
    const double length = 1.0 + double(alone_stats.spec_num_accepted_tokens) / double(alone_stats.spec_num_drafts);
    std::printf("[spec e2e] dspark k=%d: acceptance length %.2f\n", k, length);
    EXPECT_GT(length, 1.5) << "the shipped drafter keeps drafts on its own held-out code";
    if (k != 7) continue;  // batching, preemption and the prefix cache at the seed's k (CI time)
    // Adaptive verification cuts drafts by the drafter's confidence: the text stays.
    EngineConfig adaptive = spec;
    adaptive.speculative = spec_config(R"({"method":"dspark","num_speculative_tokens":7,"enable_adaptive_verification":true})");
    expect_same(reference, run(runner, adaptive, reqs, true), "dspark k=7 adaptive");
    EngineConfig batch = spec;
    batch.max_num_seqs = 8;
    batch.max_num_batched_tokens = 256;
    EngineStats batch_stats;
    expect_same(reference, run(runner, batch, reqs, false, nullptr, &batch_stats), fmt::format("dspark k={} batch", k));
    SmallPoolRunner small(runner, 7);  // 896 tokens of KV for 8 requests: preemption
    EngineStats small_stats;
    expect_same(reference, run(small, batch, reqs, false, nullptr, &small_stats), fmt::format("dspark k={} preemption", k));
    EXPECT_GT(small_stats.num_preemptions, 0u);
    EngineConfig cached = spec;
    cached.enable_prefix_caching = true;
    std::vector<EngineRequest> twice = reqs;
    for (const EngineRequest& r : reqs) {
      twice.push_back(r);
      twice.back().id += "-again";
    }
    Results twice_reference = reference;
    for (const auto& [id, r] : reference) twice_reference[id + "-again"] = r;
    EngineStats cache_stats;
    const Results hits = run(runner, cached, twice, true, nullptr, &cache_stats);
    for (auto& [id, r] : twice_reference) r.cached = hits.at(id).cached;
    expect_same(twice_reference, hits, fmt::format("dspark k={} prefix-cache hits", k));
    EXPECT_GT(cache_stats.prefix_cache_hits_tokens, 0u);
  }
}

// The host tier of the prefix cache with the drafter: sessions whose prefixes were evicted from a
// small pool come back from the host, the drafter's part of each block with them (else its
// context there would be stale): the text is the text without speculation and without the tier.
TEST(SpeculativeEngine, DSparkWithTheHostTierOfThePrefixCache) {
  SmallModel m(64, 32);
  std::vector<EngineRequest> reqs;
  for (int round = 0; round < 2; ++round)
    for (int session = 0; session < 3; ++session) {
      auto prompt = m.reference["cases"][1 + session % 3]["prompt"].get<std::vector<int32_t>>();
      prompt.resize(140);  // one full block and a part: the full block is the session's prefix
      EngineRequest q;
      q.id = fmt::format("s{}-r{}", session, round);
      q.prompt_token_ids = prompt;
      q.prompt_token_ids.push_back(3 + round);
      q.sampling.max_tokens = 24;
      q.sampling.temperature = 0.0f;
      q.sampling.seed = 1;
      q.sampling.ignore_eos = true;
      reqs.push_back(std::move(q));
    }
  MiniMaxM3Runner plain_runner(*m.model);
  EngineConfig plain;
  plain.enable_prefix_caching = false;
  const Results reference = run(plain_runner, plain, reqs, true);
  MiniMaxM3Runner runner(*m.model);
  runner.attach_dspark(m.drafter(KvDType::kF32));
  SmallPoolRunner tiered(runner, 2);  // one session's blocks at a time: the others go to the host
  tiered.with_host_blocks(32);
  EngineConfig spec;  // prefix caching on
  spec.speculative = spec_config(R"({"method":"dspark","num_speculative_tokens":7})");
  EngineStats stats;
  Results got = run(tiered, spec, reqs, true, nullptr, &stats);
  for (auto& [id, r] : got) r.cached = reference.at(id).cached;
  expect_same(reference, got, "dspark, small pool + host tier");
  EXPECT_GT(stats.kv_offload_blocks_to_device, 0u);
  EXPECT_GT(stats.spec_num_accepted_tokens, 0u);
}

// Probabilistic DSpark drafts (drawn at the request's temperature, verified with their
// distributions, standard and block): greedy requests keep their text; sampled requests' tokens
// after the first are distributed as without speculation (two-sample chi-square over 300 seeds).
TEST(SpeculativeEngine, DSparkProbabilisticDraftsKeepTheTargetsDistribution) {
  SmallModel m(64);
  MiniMaxM3& model = *m.model;
  auto prompt = m.reference["cases"][2]["prompt"].get<std::vector<int32_t>>();
  prompt.resize(257);  // two full blocks: every request after the first reads them from the prefix cache
  std::vector<EngineRequest> reqs;
  for (int r = 0; r < 300; ++r) {
    EngineRequest q;
    q.id = fmt::format("p{}", r);
    q.prompt_token_ids = prompt;
    q.sampling.max_tokens = 4;
    q.sampling.temperature = r < 4 ? 0.0f : 1.0f;
    q.sampling.seed = 5000 + r;
    q.sampling.ignore_eos = true;
    reqs.push_back(std::move(q));
  }
  EngineConfig plain;
  plain.max_num_seqs = 64;
  MiniMaxM3Runner plain_runner(model);
  const Results reference = run(plain_runner, plain, reqs, false);
  for (const char* method : {"standard", "block"}) {
    MiniMaxM3Runner runner(model);
    runner.attach_dspark(m.drafter(KvDType::kF32), /*probabilistic=*/true);
    EngineConfig spec = plain;
    spec.speculative = spec_config(fmt::format(
        R"({{"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic","rejection_sample_method":"{}"}})",
        method));
    EngineStats stats;
    const Results got = run(runner, spec, reqs, false, nullptr, &stats);
    for (int r = 0; r < 4; ++r) {
      const std::string id = fmt::format("p{}", r);
      EXPECT_EQ(got.at(id).tokens, reference.at(id).tokens) << method << ": greedy request " << id;
    }
    EXPECT_GT(stats.spec_num_accepted_tokens, 0u) << method;
    for (size_t pos = 1; pos < 4; ++pos) {
      std::vector<int32_t> a, b;
      for (int r = 4; r < 300; ++r) {
        const std::string id = fmt::format("p{}", r);
        ASSERT_EQ(got.at(id).tokens.size(), 4u);
        a.push_back(reference.at(id).tokens[pos]);
        b.push_back(got.at(id).tokens[pos]);
      }
      const auto [stat, df] = test::two_sample_chi_square(a, b);
      const double critical = test::chi_square_critical_1e4(df);
      std::printf("[spec e2e] dspark probabilistic %s: token %zu chi-square %.1f, %d df (critical %.1f)\n", method,
                  pos, stat, df, critical);
      EXPECT_LT(stat, critical) << method << " token " << pos;
    }
    std::printf("[spec e2e] dspark probabilistic %s: acceptance length %.2f\n", method,
                1.0 + double(stats.spec_num_accepted_tokens) / double(stats.spec_num_drafts));
  }
}

// A regex constraint (up to 12 lines of at most 40 characters, no tabs: code that the mask bites
// now and then) over the small model's vocabulary, compiled as the server compiles structured
// outputs.
std::shared_ptr<const TokenConstraintSpec> short_lines_constraint(const ModelConfig& config) {
  const text::Tokenizer tok = text::Tokenizer::load(SmallModel::kDir);
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(config.vocab_size));
  auto texts = std::make_shared<std::vector<std::string>>(static_cast<size_t>(config.vocab_size));
  for (int32_t id = 0; id < config.vocab_size && id < tok.vocab_size(); ++id) {
    std::optional<std::string> b = tok.token_bytes(id);
    if (!b) continue;
    (*texts)[static_cast<size_t>(id)] = *b;
    if (!tok.is_special(id)) bytes[static_cast<size_t>(id)] = std::move(b);
  }
  auto vocabulary = std::make_shared<const grammar::Vocabulary>(bytes, config.eos_token_ids);
  grammar::StructuredOutputSpec spec;
  spec.kind = grammar::StructuredOutputSpec::Kind::kRegex;
  spec.text = R"(([^\t\n]{0,40}\n){1,12})";
  spec.field = "regex";
  auto g = std::make_shared<grammar::CompiledGrammar>(grammar::structured_output_grammar(spec), vocabulary, "regex");
  return std::make_shared<grammar::GrammarConstraintSpec>(g, texts, "");
}

// DSpark drafts under a structured-output constraint: the drafter drafts each token under the
// constraint's mask after the drafts before it (the best allowed token, or a draw from the masked
// distribution), so greedy requests keep plain decoding's text and keep drafts, and sampled
// requests with probabilistic drafts draft too, their tokens distributed as without speculation
// (two-sample chi-square over 240 seeds).
TEST(SpeculativeEngine, DSparkDraftsUnderAConstraint) {
  SmallModel m(64);
  MiniMaxM3& model = *m.model;
  const auto constraint = short_lines_constraint(m.config);
  std::vector<EngineRequest> greedy;
  for (int r = 0; r < 4; ++r) {
    auto prompt = m.reference["cases"][r]["prompt"].get<std::vector<int32_t>>();
    prompt.resize(std::min<size_t>(prompt.size(), 60 + 20 * r));
    EngineRequest q;
    q.id = fmt::format("g{}", r);
    q.prompt_token_ids = prompt;
    q.sampling.max_tokens = 40;
    q.sampling.temperature = 0.0f;
    q.sampling.seed = 1;
    q.sampling.constraint = constraint;
    q.eos_token_ids = m.config.eos_token_ids;
    greedy.push_back(std::move(q));
  }
  EngineConfig plain;
  MiniMaxM3Runner plain_runner(model);
  const Results greedy_reference = run(plain_runner, plain, greedy, false);
  {
    MiniMaxM3Runner runner(model);
    runner.attach_dspark(m.drafter(KvDType::kF32));
    EngineConfig spec = plain;
    spec.speculative = spec_config(R"({"method":"dspark","num_speculative_tokens":7})");
    EngineStats stats;
    expect_same(greedy_reference, run(runner, spec, greedy, false, nullptr, &stats), "dspark k=7 under a constraint");
    const double length = 1.0 + double(stats.spec_num_accepted_tokens) / double(stats.spec_num_drafts);
    std::printf("[spec e2e] dspark k=7 greedy under a regex: acceptance length %.2f\n", length);
    EXPECT_GT(length, 1.5);
  }
  std::vector<EngineRequest> sampled;
  auto prompt = m.reference["cases"][1]["prompt"].get<std::vector<int32_t>>();
  prompt.resize(48);
  for (int r = 0; r < 240; ++r) {
    EngineRequest q;
    q.id = fmt::format("s{}", r);
    q.prompt_token_ids = prompt;
    q.sampling.max_tokens = 7;
    q.sampling.temperature = 1.0f;
    q.sampling.seed = 4000 + r;
    q.sampling.constraint = constraint;
    q.eos_token_ids = m.config.eos_token_ids;
    sampled.push_back(std::move(q));
  }
  plain.max_num_seqs = 64;
  const Results reference = run(plain_runner, plain, sampled, false);
  MiniMaxM3Runner runner(model);
  runner.attach_dspark(m.drafter(KvDType::kF32), /*probabilistic=*/true);
  EngineConfig spec = plain;
  spec.speculative = spec_config(R"({"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic"})");
  EngineStats stats;
  const Results got = run(runner, spec, sampled, false, nullptr, &stats);
  EXPECT_GT(stats.spec_num_accepted_tokens, 0u);
  for (size_t pos = 1; pos < 7; ++pos) {
    std::vector<int32_t> a, b;  // -1: the text ended before
    for (const EngineRequest& q : sampled) {
      const auto& want = reference.at(q.id).tokens;
      const auto& have = got.at(q.id).tokens;
      a.push_back(pos < want.size() ? want[pos] : -1);
      b.push_back(pos < have.size() ? have[pos] : -1);
    }
    const auto [stat, df] = test::two_sample_chi_square(a, b);
    const double critical = test::chi_square_critical_1e4(df);
    std::printf("[spec e2e] dspark probabilistic under a regex: token %zu chi-square %.1f, %d df (critical %.1f)\n",
                pos, stat, df, critical);
    EXPECT_LT(stat, critical) << "token " << pos;
  }
  std::printf("[spec e2e] dspark probabilistic under a regex: acceptance length %.2f\n",
              1.0 + double(stats.spec_num_accepted_tokens) / double(stats.spec_num_drafts));
}

TEST(NgramDrafter, LongestLatestMatch) {
  NgramDrafter d(2, 3);
  std::vector<int32_t> out;
  // "1 2 3 9 | 1 2 3 7 | 1 2 3": the latest 3-gram match is followed by 7.
  d.propose_one(std::vector<int32_t>{1, 2, 3, 9, 4, 1, 2, 3, 7, 5, 1, 2, 3}, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 5}));
  out.clear();
  // Only a 2-gram matches ("2 3" then 6); the 1-gram "3" is below prompt_lookup_min.
  d.propose_one(std::vector<int32_t>{2, 3, 6, 8, 3, 4, 5, 2, 3}, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 8, 3}));
  out.clear();
  d.propose_one(std::vector<int32_t>{1, 2, 3, 4}, 3, out);  // nothing repeats
  EXPECT_TRUE(out.empty());
  // A match near the end gives fewer than asked: the text runs out.
  d.propose_one(std::vector<int32_t>{5, 5, 5, 5}, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{5}));
  out.clear();
  d.propose_one(std::vector<int32_t>{4}, 4, out);
  EXPECT_TRUE(out.empty());
  EXPECT_THROW(NgramDrafter bad(3, 2), Error);
}

}  // namespace
}  // namespace m3
