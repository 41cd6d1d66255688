// The host tier of the prefix cache: LRU slots keyed by block hash (engine/host_kv_tier.h), and
// the KvManager's two-level prefix match and the copies it asks for (engine/kv_manager.h).
#include <gtest/gtest.h>

#include <numeric>

#include "engine/host_kv_tier.h"
#include "engine/kv_manager.h"

namespace m3 {
namespace {

std::vector<int32_t> tokens_from(int start, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

Sequence make_seq(std::vector<int32_t> tokens) {
  Sequence s;
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = static_cast<int>(s.tokens.size());
  return s;
}

TEST(HostKvTier, StoresIntoLeastRecentlyUsedSlotsAndDeduplicates) {
  HostKvTier tier(2, 4);
  const auto a = tokens_from(0, 4), b = tokens_from(10, 4), c = tokens_from(20, 4);
  const int64_t sa = tier.store(1, a);
  const int64_t sb = tier.store(2, b);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(tier.store(1, a), -1);  // already there: nothing to copy
  EXPECT_EQ(tier.num_stored(), 2);
  EXPECT_EQ(tier.lookup(1, a), sa);  // a is now the most recently used
  EXPECT_EQ(tier.lookup(2, a), -1);  // a hash collision with other tokens is a miss
  EXPECT_EQ(tier.store(3, c), sb);   // b was the least recently used
  EXPECT_EQ(tier.lookup(2, b), -1);
  EXPECT_EQ(tier.lookup(3, c), sb);
  EXPECT_EQ(tier.num_stored(), 2);
}

TEST(HostKvTier, PinnedSlotsAreNotOverwrittenUntilUnpinned) {
  HostKvTier tier(1, 2);
  const int64_t s = tier.store(7, tokens_from(0, 2));
  tier.pin(s);  // a copy back from s is pending
  EXPECT_EQ(tier.store(8, tokens_from(5, 2)), -1);
  EXPECT_EQ(tier.lookup(7, tokens_from(0, 2)), s);
  tier.unpin_all();
  EXPECT_EQ(tier.store(8, tokens_from(5, 2)), s);
  EXPECT_EQ(tier.lookup(7, tokens_from(0, 2)), -1);
}

TEST(HostKvTier, AForgottenSlotHoldsNothingAndIsReusedFirst) {
  HostKvTier tier(2, 2);
  const int64_t s7 = tier.store(7, tokens_from(0, 2));
  const int64_t s8 = tier.store(8, tokens_from(5, 2));
  EXPECT_TRUE(tier.holds(7));
  tier.forget(s8);  // the copy into it failed
  EXPECT_FALSE(tier.holds(8));
  EXPECT_EQ(tier.lookup(8, tokens_from(5, 2)), -1);
  EXPECT_EQ(tier.num_stored(), 1);
  EXPECT_EQ(tier.store(9, tokens_from(9, 2)), s8);  // before s7, the least recently used in use
  EXPECT_EQ(tier.lookup(7, tokens_from(0, 2)), s7);
}

// Computes and registers `seq` whole, then frees it (its blocks stay cached on the free list).
void compute_and_free(KvManager& kv, Sequence& seq) {
  kv.update_hashes(seq);
  kv.match_prefix(seq);
  ASSERT_TRUE(kv.allocate(seq, seq.num_tokens()));
  seq.num_computed_tokens = seq.num_tokens();
  kv.commit_computed(seq);
  kv.free(seq);
}

TEST(KvManager, EvictedBlocksGoToTheHostTierAndComeBackOnAPrefixHit) {
  KvManager kv(3, 4, true, 8);  // 3 pool blocks, 8 host slots
  Sequence a = make_seq(tokens_from(0, 9));  // 2 full blocks + 1 token
  compute_and_free(kv, a);
  EXPECT_TRUE(kv.take_transfers().empty());
  Sequence b = make_seq(tokens_from(100, 12));  // needs all 3 blocks: evicts a's two cached ones
  compute_and_free(kv, b);
  const KvManager::Transfers out = kv.take_transfers();
  ASSERT_EQ(out.to_host.size(), 2u);
  EXPECT_TRUE(out.to_device.empty());
  EXPECT_EQ(kv.host_tier()->num_stored(), 2);

  // a again: its blocks are not in the pool (b's are), but both are in the host tier.
  Sequence a2 = make_seq(tokens_from(0, 9));
  kv.update_hashes(a2);
  EXPECT_EQ(kv.match_prefix(a2), 8);
  const KvManager::Transfers in = kv.take_transfers();
  ASSERT_EQ(in.to_device.size(), 2u);
  EXPECT_EQ(in.to_device[0].block, a2.block_table[0]);
  EXPECT_EQ(in.to_device[1].block, a2.block_table[1]);
  // free() releases a chain's tail first, so the tail was evicted (and saved) first.
  EXPECT_EQ(in.to_device[0].host_slot, out.to_host[1].host_slot);
  EXPECT_EQ(in.to_device[1].host_slot, out.to_host[0].host_slot);
  // Restoring took two of b's cached blocks: they went to the host tier first, in the same batch.
  EXPECT_EQ(in.to_host.size(), 2u);
  EXPECT_EQ(a2.num_offload_hit_tokens, 8);
  EXPECT_EQ(kv.blocks_to_host(), 4u);
  EXPECT_EQ(kv.blocks_to_device(), 2u);
  // Restored blocks are cached blocks: another request with the prefix hits them in the pool.
  Sequence a3 = make_seq(tokens_from(0, 9));
  kv.update_hashes(a3);
  EXPECT_EQ(kv.match_prefix(a3), 8);
  EXPECT_TRUE(kv.take_transfers().to_device.empty());
  EXPECT_EQ(a3.block_table, a2.block_table);
  kv.free(a2);
  kv.free(a3);
  kv.pool().check_invariants();
}

TEST(KvManager, ARestoredBlockLeavingThePoolAgainCostsNoCopy) {
  KvManager kv(2, 4, true, 4);
  Sequence a = make_seq(tokens_from(0, 5));
  compute_and_free(kv, a);
  Sequence b = make_seq(tokens_from(50, 8));
  compute_and_free(kv, b);  // evicts a's block to the host
  EXPECT_EQ(kv.take_transfers().to_host.size(), 1u);
  Sequence a2 = make_seq(tokens_from(0, 5));
  kv.update_hashes(a2);
  EXPECT_EQ(kv.match_prefix(a2), 4);
  EXPECT_EQ(kv.take_transfers().to_device.size(), 1u);
  kv.free(a2);
  Sequence c = make_seq(tokens_from(80, 8));
  compute_and_free(kv, c);  // evicts the restored block (its prefix is still on the host) and one of b's
  const KvManager::Transfers t = kv.take_transfers();
  EXPECT_EQ(t.to_host.size(), 1u);  // b's block only
}

TEST(KvManager, NoHostTierWithoutPrefixCaching) {
  KvManager kv(2, 4, false, 4);
  EXPECT_EQ(kv.host_tier(), nullptr);
}

TEST(KvManager, ARestoreStopsWhenThePoolHasNoFreeBlock) {
  KvManager kv(2, 4, true, 4);
  Sequence a = make_seq(tokens_from(0, 9));
  kv.update_hashes(a);
  ASSERT_TRUE(kv.allocate(a, 8));
  a.num_computed_tokens = 8;
  kv.commit_computed(a);
  kv.free(a);
  Sequence b = make_seq(tokens_from(50, 8));
  compute_and_free(kv, b);  // both of a's blocks to the host
  Sequence holder = make_seq(tokens_from(90, 8));
  ASSERT_TRUE(kv.allocate(holder, 8));  // the whole pool is referenced
  kv.take_transfers();
  Sequence a2 = make_seq(tokens_from(0, 9));
  kv.update_hashes(a2);
  EXPECT_EQ(kv.match_prefix(a2), 0);
  EXPECT_TRUE(kv.take_transfers().empty());
  kv.free(holder);
}

// Saving ahead: the cached blocks the next allocations would evict are copied while they sit
// free; evicting them later costs no copy, and the step that reuses them waits only for the
// batch that saved them.
TEST(KvManager, CachedFreeBlocksAreSavedAheadOfTheirEviction) {
  KvManager kv(4, 4, true, 8, 4);  // 4 pool blocks, 8 host slots, save up to 4 ahead
  Sequence a = make_seq(tokens_from(0, 9));  // blocks 0, 1 full and cached, 2 partial
  compute_and_free(kv, a);
  const KvManager::Transfers first = kv.take_transfers();
  EXPECT_EQ(first.batch, 1u);
  EXPECT_TRUE(first.to_host.empty());
  ASSERT_EQ(first.to_host_ahead.size(), 2u);  // the two cached blocks, not the partial one
  EXPECT_EQ(first.wait_for_batch, 0u);
  EXPECT_EQ(kv.blocks_saved_ahead(), 2u);
  EXPECT_TRUE(kv.take_transfers().empty());  // saved once

  Sequence b = make_seq(tokens_from(100, 16));  // all 4 blocks: evicts a's two
  kv.update_hashes(b);
  ASSERT_TRUE(kv.allocate(b, 16));
  const KvManager::Transfers second = kv.take_transfers();
  EXPECT_TRUE(second.to_host.empty());   // a's prefix is on the host already
  EXPECT_EQ(second.wait_for_batch, 1u);  // but b overwrites blocks batch 1 was reading
  EXPECT_EQ(kv.steps_waiting_for_saves(), 1u);
  b.num_computed_tokens = 16;
  kv.commit_computed(b);
  kv.free(b);
  EXPECT_EQ(kv.take_transfers().to_host_ahead.size(), 4u);  // batch 4 saves b's blocks ahead

  Sequence a2 = make_seq(tokens_from(0, 9));
  kv.update_hashes(a2);
  EXPECT_EQ(kv.match_prefix(a2), 8);
  const KvManager::Transfers third = kv.take_transfers();
  ASSERT_EQ(third.to_device.size(), 2u);
  for (const KvBlockCopy& in : third.to_device) {
    EXPECT_TRUE(in.host_slot == first.to_host_ahead[0].host_slot || in.host_slot == first.to_host_ahead[1].host_slot);
  }
  EXPECT_TRUE(third.to_host.empty());  // b's evicted blocks were saved ahead too
  EXPECT_EQ(third.wait_for_batch, 4u);
  kv.free(a2);
  kv.pool().check_invariants();
}

TEST(KvManager, AFailedCopyLeavesNothingBehind) {
  KvManager kv(2, 4, true, 4, 2);
  Sequence a = make_seq(tokens_from(0, 8));
  compute_and_free(kv, a);
  const KvManager::Transfers saves = kv.take_transfers();
  ASSERT_EQ(saves.to_host_ahead.size(), 2u);
  kv.drop_failed(saves);  // the copies never arrived
  EXPECT_EQ(kv.host_tier()->num_stored(), 0);
  Sequence b = make_seq(tokens_from(50, 8));
  compute_and_free(kv, b);  // evicts a's blocks: saved now, as nothing holds them
  EXPECT_EQ(kv.take_transfers().to_host.size(), 2u);
}

}  // namespace
}  // namespace m3
