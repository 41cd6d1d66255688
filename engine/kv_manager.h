// Sequence-level KV block management over the BlockPool: block tables, prefix-cache matching
// and registration. Bookkeeping only; the scheduler decides who gets blocks.
//
// With a host tier (engine/host_kv_tier.h, host_slots > 0) the prefix cache has two levels: a
// cached block evicted from the pool is first copied to a host slot (unless its prefix is there
// already), and a prefix match that runs out of pool blocks goes on in the host tier, each hit
// taking a free pool block that is registered at once and filled by a copy from its slot. The
// copies pile up here and go to the model before the next step (take_transfers): every copy to
// the host first, then every copy back, so a block evicted and refilled in one step is saved
// before it is overwritten. To the scheduler a restored block is a cached block like any other.
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
  // host_slots > 0 (and prefix caching on): the host tier of that many blocks.
  KvManager(int64_t num_blocks, int block_size, bool enable_prefix_caching, int64_t host_slots = 0);

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
  // Registers the blocks that are now full and computed in the prefix cache.
  void commit_computed(Sequence& seq);
  // Releases every block (last block first, so a chain's tail is evicted before its head) and
  // resets the sequence to "nothing computed".
  void free(Sequence& seq);

  // The copies the model must make before the next step reads the pool; clears them and unpins
  // the host slots they read.
  struct Transfers {
    std::vector<KvBlockCopy> to_host, to_device;
    bool empty() const { return to_host.empty() && to_device.empty(); }
  };
  Transfers take_transfers();
  // After `transfers` failed: the blocks they were to restore leave the prefix cache.
  void drop_restored(const Transfers& transfers);
  uint64_t blocks_to_host() const { return blocks_to_host_; }      // copies handed out so far
  uint64_t blocks_to_device() const { return blocks_to_device_; }

 private:
  // A free pool block; a cached prefix it evicts goes to the host tier first.
  int32_t allocate_block();

  BlockPool pool_;
  bool prefix_caching_;
  std::optional<HostKvTier> host_;
  Transfers pending_;
  uint64_t blocks_to_host_ = 0, blocks_to_device_ = 0;
};

}  // namespace m3
