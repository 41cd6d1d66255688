// End to end on real MiniMax-M3 checkpoints (the tiny golden models, whose 8-token blocks make
// sparse block selection bite within ~40 tokens, and the bundled model with 128-token blocks):
// greedy and seeded outputs are identical alone, in a batch of 32, after forced preemption and
// on prefix-cache hits (which restore K, V and the index-K lane).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <map>

#include <fmt/core.h>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_loop.h"
#include "engine/minimax_m3_runner.h"
#include "tests/engine/real_model.h"

namespace m3 {
namespace {

// 32 requests; half of them continue a shared 48-token prefix (system prompt style), lengths
// 6..110 so that most contexts exceed the sparse layers' top-k window.
std::vector<EngineRequest> workload(int vocab, int n, float temperature) {
  std::vector<int32_t> shared(48);
  for (int i = 0; i < 48; ++i) shared[i] = 3 + static_cast<int32_t>(mix(900 + i) % (vocab - 3));
  std::vector<EngineRequest> reqs;
  for (int r = 0; r < n; ++r) {
    EngineRequest req;
    req.id = fmt::format("q{}", r);
    if (r % 2) req.prompt_token_ids = shared;
    const int tail = 6 + static_cast<int>(mix(r) % 60);
    for (int i = 0; i < tail; ++i) req.prompt_token_ids.push_back(3 + static_cast<int32_t>(mix(r * 131 + i) % (vocab - 3)));
    req.sampling.max_tokens = 6 + r % 11;
    req.sampling.temperature = temperature;
    req.sampling.top_p = 0.95f;
    req.sampling.seed = 4242 + r;
    reqs.push_back(std::move(req));
  }
  return reqs;
}

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int cached = 0;
};
using Results = std::map<std::string, Result>;

Results run(ModelRunner& runner, EngineConfig config, const std::vector<EngineRequest>& reqs, bool one_at_a_time,
            EngineStats* stats = nullptr) {
  config.max_model_len = 1024;
  EngineLoop loop(runner, config);
  Results results;
  auto add = [&](const EngineRequest& r) {
    loop.add(r, [&results, id = r.id](const RequestOutput& out) {
      Result& res = results[id];
      res.tokens.insert(res.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) {
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

void expect_same(const Results& reference, const Results& other, const char* what) {
  ASSERT_EQ(reference.size(), other.size()) << what;
  int differing = 0;
  for (const auto& [id, r] : reference) {
    EXPECT_EQ(r.tokens, other.at(id).tokens) << what << ": request " << id;
    EXPECT_EQ(r.reason, other.at(id).reason) << what << ": request " << id;
    differing += r.tokens != other.at(id).tokens;
  }
  std::printf("[engine e2e] %s: %zu requests, %d differ\n", what, reference.size(), differing);
}

void check_determinism(const std::filesystem::path& dir, KvDType kv, float temperature,
                       DType activations = DType::kF32) {
  Loaded m = load(dir, kv, 600, activations);
  MiniMaxM3Runner runner(*m.model);
  const auto reqs = workload(runner.vocab_size(), 32, temperature);

  EngineConfig no_cache;
  no_cache.enable_prefix_caching = false;
  const Results alone = run(runner, no_cache, reqs, true);

  EngineConfig batch = no_cache;
  batch.max_num_seqs = 32;
  batch.max_num_batched_tokens = 512;
  expect_same(alone, run(runner, batch, reqs, false), "batch of 32");

  EngineConfig chunked = batch;
  chunked.max_num_batched_tokens = 37;  // odd budget: chunks cut blocks anywhere
  expect_same(alone, run(runner, chunked, reqs, false), "chunked prefill, budget 37");

  SmallPoolRunner small(runner, 40);  // 320 tokens of KV for 32 requests
  EngineStats stats;
  expect_same(alone, run(small, batch, reqs, false, &stats), "forced preemption");
  EXPECT_GT(stats.num_preemptions, 0u);

  EngineConfig cached = batch;
  cached.enable_prefix_caching = true;
  const Results hits = run(runner, cached, reqs, true, &stats);  // sequential: later ones hit
  expect_same(alone, hits, "prefix-cache hits");
  int hit_requests = 0;
  for (const auto& [id, r] : hits) hit_requests += r.cached > 0;
  EXPECT_GE(hit_requests, 15);
  EXPECT_GE(stats.prefix_cache_hits_tokens, 15u * 48u);
  std::printf("[engine e2e] prefix cache: %llu of %llu prompt tokens hit\n",
              static_cast<unsigned long long>(stats.prefix_cache_hits_tokens),
              static_cast<unsigned long long>(stats.prefix_cache_queries_tokens));
}


TEST(MiniMaxM3Engine, GreedyIdenticalAcrossBatchingPreemptionAndPrefixHitsSparseModel) {
  check_determinism(kSparse, KvDType::kF32, 0.0f);
}

TEST(MiniMaxM3Engine, GreedyIdenticalWithNvfp4KvOnMixedModel) { check_determinism(kMixed, KvDType::kNVFP4, 0.0f); }

TEST(MiniMaxM3Engine, SeededSamplingIdenticalAcrossBatchingPreemptionAndPrefixHits) {
  check_determinism(kSparse, KvDType::kF32, 0.8f);
}

// The CPU forward is bitwise batch-invariant (cpu::gemm_xwt sums every output in one fixed
// order), so the server's default numerics, bf16 activations with a quantized KV cache, give the
// same tokens in any batch, even where a rounding boundary would amplify a last-bit difference.
TEST(MiniMaxM3Engine, Bf16GreedyIdenticalAcrossBatchingPreemptionAndPrefixHits) {
  check_determinism(kSparse, KvDType::kBF16, 0.0f, DType::kBF16);
}

TEST(MiniMaxM3Engine, Bf16SeededSamplingWithFp8KvIdenticalAcrossBatching) {
  check_determinism(kMixed, KvDType::kFP8, 0.8f, DType::kBF16);
}

// Agentic traffic on a pool too small to keep it: sessions with long shared prefixes come back
// after other sessions evicted their blocks. With the host tier the evicted blocks are copied out
// and back instead of recomputed; greedy tokens are those of a run that never caches anything.
std::vector<EngineRequest> returning_sessions(int vocab) {
  auto ids = [&](uint64_t seed, int n) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = 3 + static_cast<int32_t>(mix(seed * 7919 + i) % (vocab - 3));
    return v;
  };
  std::vector<EngineRequest> reqs;
  for (int round = 0; round < 3; ++round) {
    for (int session = 0; session < 3; ++session) {
      EngineRequest r;
      r.id = fmt::format("s{}-r{}", session, round);
      r.prompt_token_ids = ids(100 + session, 44);  // the session's 5 full blocks and a half
      const auto turn = ids(1000 + round * 10 + session, 5 + (round + session) % 7);
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), turn.begin(), turn.end());
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = 6;
      r.sampling.seed = 1;
      reqs.push_back(std::move(r));
    }
    EngineRequest other;  // a one-off request in between
    other.id = fmt::format("other-r{}", round);
    other.prompt_token_ids = ids(5000 + round, 70);
    other.sampling.temperature = 0.0f;
    other.sampling.max_tokens = 6;
    other.sampling.seed = 1;
    reqs.push_back(std::move(other));
  }
  return reqs;
}

void check_host_tier(const std::filesystem::path& dir, KvDType kv, DType activations) {
  Loaded m = load(dir, kv, 600, activations, 64);
  MiniMaxM3Runner runner(*m.model);
  const auto reqs = returning_sessions(runner.vocab_size());
  EngineConfig no_cache;
  no_cache.enable_prefix_caching = false;
  const Results reference = run(runner, no_cache, reqs, true);

  EngineConfig cached;  // prefix caching on (the default)
  SmallPoolRunner pool_only(runner, 12);  // 96 tokens: one session's blocks at a time
  EngineStats without;
  expect_same(reference, run(pool_only, cached, reqs, true, &without), "small pool, no host tier");
  EXPECT_EQ(without.kv_offload_blocks_to_host, 0u);

  SmallPoolRunner tiered(runner, 12);
  tiered.with_host_blocks(64);
  EngineStats with;
  expect_same(reference, run(tiered, cached, reqs, true, &with), "small pool + host tier");
  EXPECT_GT(with.kv_offload_blocks_to_host, 0u);
  EXPECT_GT(with.kv_offload_blocks_to_device, 0u);
  EXPECT_EQ(with.kv_offload_bytes_to_device, with.kv_offload_blocks_to_device * m.model->kv_layout().block_bytes);
  // The sessions' second and third rounds find their 5 prefix blocks on the host.
  EXPECT_GE(with.external_prefix_cache_hits_tokens, 6u * 40u);
  EXPECT_GT(with.prefix_cache_hits_tokens, without.prefix_cache_hits_tokens + 6u * 32u);
  EXPECT_EQ(with.external_prefix_cache_queries_tokens, with.prefix_cache_queries_tokens);
  EXPECT_EQ(with.num_host_kv_blocks, 64);
  std::printf("[engine e2e] host tier: %llu of %llu prompt tokens hit (%llu from the host; %llu without the tier), "
              "%llu blocks out, %llu back\n",
              static_cast<unsigned long long>(with.prefix_cache_hits_tokens),
              static_cast<unsigned long long>(with.prefix_cache_queries_tokens),
              static_cast<unsigned long long>(with.external_prefix_cache_hits_tokens),
              static_cast<unsigned long long>(without.prefix_cache_hits_tokens),
              static_cast<unsigned long long>(with.kv_offload_blocks_to_host),
              static_cast<unsigned long long>(with.kv_offload_blocks_to_device));

  // A host tier smaller than the sessions' prefixes evicts by LRU and stays exact; so do batches
  // (staggered arrivals, with preemption in the small pool).
  SmallPoolRunner small_tier(runner, 12);
  small_tier.with_host_blocks(7);
  EngineStats lru;
  expect_same(reference, run(small_tier, cached, reqs, true, &lru), "small pool + 7-block host tier");
  EXPECT_EQ(lru.num_stored_host_kv_blocks, 7);
  EXPECT_GT(lru.kv_offload_blocks_to_host, 7u);  // its slots were taken over, least recently used first
  EngineConfig batch = cached;
  batch.max_num_seqs = 8;
  batch.max_num_batched_tokens = 64;
  SmallPoolRunner batched(runner, 16);
  batched.with_host_blocks(64);
  EngineStats b;
  expect_same(reference, run(batched, batch, reqs, false, &b), "batches, small pool + host tier");
}

TEST(MiniMaxM3Engine, HostTierRestoresEvictedPrefixesWithIdenticalGreedyTokens) {
  check_host_tier(kSparse, KvDType::kF32, DType::kF32);
}

// NVFP4 K, V and index-K: the blocks carry their scale rows through the host and back.
TEST(MiniMaxM3Engine, HostTierWithNvfp4KvAndIndexKeysOnMixedModel) {
  check_host_tier(kMixed, KvDType::kNVFP4, DType::kBF16);
}

// The copies themselves: a block's bytes (every layer's K, V, index-K and scales) out to a host
// slot and back into another block are the same bytes.
TEST(MiniMaxM3Engine, CopyKvBlocksMovesWholeBlocksBitwise) {
  Loaded m = load(kMixed, KvDType::kNVFP4, 8, DType::kBF16, 3);
  MiniMaxM3Runner runner(*m.model);
  EngineConfig config;
  config.max_model_len = 64;
  EngineLoop loop(runner, config);
  EngineRequest r;
  r.id = "fill";
  for (int i = 0; i < 20; ++i) r.prompt_token_ids.push_back(3 + i);
  r.sampling.max_tokens = 1;
  r.sampling.temperature = 0.0f;
  loop.add(r, nullptr, 1, Clock::now());
  while (loop.has_work()) loop.step();
  const int64_t bb = m.model->kv_layout().block_bytes;
  const uint8_t* pool = m.model->kv_pool().data_as<const uint8_t>();
  const std::vector<uint8_t> block0(pool, pool + bb), block1(pool + bb, pool + 2 * bb);
  ASSERT_NE(block0, std::vector<uint8_t>(bb, 0));
  KvBlockCopies out, in;
  out.to_host = {{0, 2}, {1, 0}};
  in.to_device = {{6, 2}, {7, 0}};
  runner.copy_kv_blocks(out);
  runner.copy_kv_blocks(in);
  EXPECT_EQ(std::vector<uint8_t>(pool + 6 * bb, pool + 7 * bb), block0);
  EXPECT_EQ(std::vector<uint8_t>(pool + 7 * bb, pool + 8 * bb), block1);
  KvBlockCopies bad_block, bad_slot;
  bad_block.to_host = {{8, 0}};
  bad_slot.to_device = {{0, 3}};
  EXPECT_THROW(runner.copy_kv_blocks(bad_block), Error);  // block outside the pool
  EXPECT_THROW(runner.copy_kv_blocks(bad_slot), Error);   // slot outside the tier
}

TEST(MiniMaxM3Engine, EngineCoreServesTheBundledModelWithFullBlockPrefixHits) {
  const std::filesystem::path dir = "models/minimax-m3-tiny";
  Loaded m = load(dir, KvDType::kBF16, 24);
  EngineConfig config;
  config.max_num_batched_tokens = 512;
  EngineCore engine(std::make_unique<MiniMaxM3Runner>(*m.model), config);
  EXPECT_EQ(engine.block_size(), 128);
  engine.start();
  std::vector<int32_t> prompt(300);
  for (int i = 0; i < 300; ++i) prompt[i] = 3 + static_cast<int32_t>(mix(i) % 8000);

  auto generate = [&](const std::string& id, std::vector<int32_t> ids) {
    std::promise<Result> done;
    auto result = std::make_shared<Result>();
    EngineRequest r;
    r.id = id;
    r.prompt_token_ids = std::move(ids);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 8;
    engine.add_request(r, [&done, result](const RequestOutput& out) {
      result->tokens.insert(result->tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) {
        result->reason = out.finish_reason;
        result->cached = out.num_cached_prompt_tokens;
        done.set_value(*result);
      }
    });
    return done.get_future().get();
  };
  const Result first = generate("a", prompt);
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(first.tokens.size(), 8u);
  const Result second = generate("b", prompt);
  EXPECT_EQ(second.cached, 256);  // two full 128-token blocks; the rest is recomputed
  EXPECT_EQ(second.tokens, first.tokens);
  auto turn2 = prompt;  // the next turn: the previous answer appended
  turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
  const Result third = generate("c", turn2);
  EXPECT_EQ(third.cached, 256);
  engine.shutdown(true);
  EXPECT_EQ(engine.stats().num_used_kv_blocks, 0);
}

}  // namespace
}  // namespace m3
