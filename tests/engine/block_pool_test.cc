#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "engine/block_pool.h"
#include "engine/kv_manager.h"

namespace m3 {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockPool, AllocateReleaseCountsAndInvariants) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.num_free(), 4);
  const int32_t a = pool.allocate();
  const int32_t b = pool.allocate();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.ref_count(a), 1);
  pool.acquire(a);
  EXPECT_EQ(pool.ref_count(a), 2);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 4);
  pool.check_invariants();
  EXPECT_THROW(pool.release(a), Error);
}

TEST(BlockPool, CachedBlocksSurviveFreeingAndAreEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(3, 2);
  const auto t0 = iota_tokens(2, 0), t1 = iota_tokens(2, 10);
  const uint64_t h0 = block_hash(kRootBlockHash, t0), h1 = block_hash(kRootBlockHash, t1);
  const int32_t b0 = pool.allocate(), b1 = pool.allocate(), b2 = pool.allocate();
  pool.register_block(b0, h0, t0);
  pool.register_block(b1, h1, t1);
  pool.release(b0);  // cached, freed first -> evicted first
  pool.release(b1);  // cached
  pool.release(b2);  // uncached -> reused before any cached block
  pool.check_invariants();
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.lookup(h0, t0), b0);
  EXPECT_EQ(pool.lookup(h1, t1), b1);

  EXPECT_EQ(pool.allocate(), b2);
  EXPECT_EQ(pool.allocate(), b0);  // evicts h0
  EXPECT_EQ(pool.lookup(h0, t0), -1);
  EXPECT_EQ(pool.lookup(h1, t1), b1);
  // A hit on a free cached block takes it off the free list.
  pool.acquire(b1);
  EXPECT_EQ(pool.num_free(), 0);
  pool.check_invariants();
}

TEST(BlockPool, LookupRejectsHashCollisionsAndDuplicateRegistrationKeepsTheFirst) {
  BlockPool pool(2, 2);
  const auto t = iota_tokens(2, 5);
  const auto other = iota_tokens(2, 7);
  const uint64_t h = block_hash(kRootBlockHash, t);
  const int32_t a = pool.allocate(), b = pool.allocate();
  pool.register_block(a, h, t);
  EXPECT_EQ(pool.lookup(h, other), -1);  // same hash, other tokens: a miss, never wrong KV
  pool.register_block(b, h, t);          // same prefix computed twice: first one stays
  EXPECT_EQ(pool.lookup(h, t), a);
  EXPECT_FALSE(pool.is_cached(b));
  pool.check_invariants();
}

TEST(BlockHash, ChainsOverParents) {
  const auto t = iota_tokens(4);
  EXPECT_EQ(block_hash(kRootBlockHash, t), block_hash(kRootBlockHash, t));
  EXPECT_NE(block_hash(kRootBlockHash, t), block_hash(kRootBlockHash + 1, t));
  auto t2 = t;
  t2[3] = 99;
  EXPECT_NE(block_hash(kRootBlockHash, t), block_hash(kRootBlockHash, t2));
}

Sequence make_seq(std::vector<int32_t> tokens) {
  Sequence s;
  s.request.id = std::string(1, 'r');  // (a literal here trips GCC 12's -Wrestrict false positive)
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = s.num_tokens();
  return s;
}

TEST(KvManager, PrefixMatchReusesFullBlocksButAlwaysLeavesTheLastToken) {
  KvManager kv(16, 4, true);
  Sequence a = make_seq(iota_tokens(12));
  kv.update_hashes(a);
  ASSERT_EQ(a.block_hashes.size(), 3u);
  EXPECT_EQ(kv.match_prefix(a), 0);
  ASSERT_TRUE(kv.allocate(a, 12));
  a.num_computed_tokens = 12;
  kv.commit_computed(a);
  EXPECT_EQ(kv.pool().num_cached(), 3);

  // Same 12 tokens: only 2 blocks are reused, the last block is recomputed (needs logits).
  Sequence b = make_seq(iota_tokens(12));
  kv.update_hashes(b);
  EXPECT_EQ(kv.match_prefix(b), 8);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(kv.pool().ref_count(a.block_table[0]), 2);

  // A longer prompt with the same 12-token prefix reuses all three blocks.
  Sequence c = make_seq(iota_tokens(14));
  kv.update_hashes(c);
  EXPECT_EQ(kv.match_prefix(c), 12);

  // Diverging inside block 1: only block 0 matches.
  auto tokens = iota_tokens(12);
  tokens[5] = 1000;
  Sequence d = make_seq(tokens);
  kv.update_hashes(d);
  EXPECT_EQ(kv.match_prefix(d), 4);

  kv.free(a);
  kv.free(b);
  kv.free(c);
  kv.free(d);
  EXPECT_EQ(kv.pool().num_free(), 16);
  EXPECT_EQ(kv.pool().num_cached(), 3);  // still reusable after everyone left
  kv.pool().check_invariants();
}

TEST(KvManager, HashesOnlyNewFullBlocksAndRegistersAfterCompute) {
  KvManager kv(8, 4, true);
  Sequence s = make_seq(iota_tokens(6));
  kv.update_hashes(s);
  EXPECT_EQ(s.block_hashes.size(), 1u);
  const uint64_t first = s.block_hashes[0];
  s.tokens.push_back(6);
  s.tokens.push_back(7);
  kv.update_hashes(s);
  ASSERT_EQ(s.block_hashes.size(), 2u);
  EXPECT_EQ(s.block_hashes[0], first);
  EXPECT_EQ(s.block_hashes[1], block_hash(first, std::vector<int32_t>{4, 5, 6, 7}));
  ASSERT_TRUE(kv.allocate(s, 8));
  s.num_computed_tokens = 5;  // block 1 not fully computed yet: not registered
  kv.commit_computed(s);
  EXPECT_EQ(kv.pool().num_cached(), 1);
  s.num_computed_tokens = 8;
  kv.commit_computed(s);
  EXPECT_EQ(kv.pool().num_cached(), 2);
}

TEST(KvManager, AllocateIsAllOrNothingAndFreeResets) {
  KvManager kv(3, 4, false);
  Sequence a = make_seq(iota_tokens(8));
  ASSERT_TRUE(kv.allocate(a, 8));
  EXPECT_EQ(a.block_table.size(), 2u);
  Sequence b = make_seq(iota_tokens(8));
  EXPECT_FALSE(kv.allocate(b, 8));
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(kv.pool().num_free(), 1);
  EXPECT_EQ(kv.match_prefix(b), 0);  // caching off
  a.num_computed_tokens = 8;
  kv.free(a);
  EXPECT_EQ(a.num_computed_tokens, 0);
  EXPECT_TRUE(a.block_table.empty());
  EXPECT_EQ(kv.pool().num_free(), 3);
  EXPECT_EQ(kv.pool().num_cached(), 0);
}

}  // namespace
}  // namespace m3
