// Sequence-level KV block management over the BlockPool: block tables, prefix-cache matching
// and registration. Bookkeeping only; the scheduler decides who gets blocks.
//
// With a host tier (engine/host_kv_tier.h, host_slots > 0) the prefix cache has two levels: a
// cached block evicted from the pool is first copied to a host slot (unless its prefix is there
// already), and a prefix match that runs out of pool blocks goes on in the host tier, each hit
// taking a free pool block that is registered at once and filled by a copy from its slot. The
// copies pile up here and go to the model before the next step (take_transfers). To the
// scheduler a restored block is a cached block like any other.
//
// Saving ahead of eviction: a block evicted now is copied out before the step that overwrites it
// may run, so that step waits for the copy. To keep such waits rare, take_transfers also saves
// the cached blocks the next steps would evict first (the head of the pool's free list, as many
// as a step can allocate: save_ahead_blocks) while they sit unreferenced: those copies overlap
// with the step, and when the block is evicted later its prefix is on the host already. The step
// that reuses such a block waits for the batch that saved it (KvBlockCopies::wait_for_batch),
// long done by then unless the step before was very short.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/block_pool.h"
#include "engine/host_kv_tier.h"
#include "engine/sequence.h"
#include "ops/kv_layout.h"

namespace m3 {

class KvManager {
 public:
  // host_slots > 0 (and prefix caching on): the host tier of that many blocks, saving
  // save_ahead_blocks free blocks ahead of their eviction (0: only when evicted).
  KvManager(int64_t num_blocks, int block_size, bool enable_prefix_caching, int64_t host_slots = 0,
            int64_t save_ahead_blocks = 0);

  const BlockPool& pool() const { return pool_; }
  // The host tier, or null.
  const HostKvTier* host_tier() const { return host_ ? &*host_ : nullptr; }
  int block_size() const { return pool_.block_size(); }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size() - 1) / block_size(); }

  // Extends seq.block_hashes to every full block of seq.tokens (hashing only the new ones).
  void update_hashes(Sequence& seq) const;
  // For a sequence holding no blocks: takes the longest chain of cached blocks matching its
  // tokens, always leaving at least the last token to compute. Sets num_computed_tokens and
  // returns it (0 without prefix caching).
  int match_prefix(Sequence& seq);
  // Grows the block table to cover num_total_tokens. Returns false, allocating nothing, when the
  // pool has too few free blocks.
  bool allocate(Sequence& seq, int num_total_tokens);
  // Gives back the blocks past those num_tokens tokens need (last first): after a speculative
  // step, the blocks that held only rejected drafts. They were never registered.
  void trim(Sequence& seq, int num_tokens);
  // Registers the blocks that are now full and computed in the prefix cache.
  void commit_computed(Sequence& seq);
  // Releases every block (last block first, so a chain's tail is evicted before its head) and
  // resets the sequence to "nothing computed".
  void free(Sequence& seq);

  // The copies the model must make before the next step runs (with the saves ahead of eviction);
  // clears them and unpins the host slots they read.
  using Transfers = KvBlockCopies;
  Transfers take_transfers();
  // After `transfers` failed: the blocks they were to restore leave the prefix cache, the host
  // slots they were to fill hold nothing.
  void drop_failed(const Transfers& transfers);
  uint64_t blocks_to_host() const { return blocks_to_host_; }      // copies handed out so far
  uint64_t blocks_to_device() const { return blocks_to_device_; }
  uint64_t blocks_saved_ahead() const { return blocks_saved_ahead_; }  // of blocks_to_host()
  // Steps that waited for copies to the host: blocks evicted without a copy made ahead, or a
  // batch of saves ahead (KvBlockCopies::wait_for_batch).
  uint64_t steps_waiting_for_saves() const { return steps_waiting_; }

 private:
  // A free pool block; a cached prefix it evicts goes to the host tier first.
  int32_t allocate_block();
  // Queues a copy of `block` to `slot` in the batch pending_ becomes: one the step waits for, or
  // (ahead) one it does not.
  void save(int32_t block, int64_t slot, bool ahead);
  void save_ahead();

  BlockPool pool_;
  bool prefix_caching_;
  std::optional<HostKvTier> host_;
  int64_t save_ahead_blocks_ = 0;
  Transfers pending_;
  // Batches are numbered from 1 (batch_ is pending_'s); saved_in_[b] is the batch of block b's
  // last copy to the host (0: none); every step after the one that waited for batch
  // waited_batch_ runs after all of that batch's copies and those before it.
  uint64_t batch_ = 1, waited_batch_ = 0;
  std::vector<uint64_t> saved_in_;
  uint64_t blocks_to_host_ = 0, blocks_to_device_ = 0, blocks_saved_ahead_ = 0, steps_waiting_ = 0;
};

}  // namespace m3
