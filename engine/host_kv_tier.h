// The second level of the prefix cache (--kv-offloading-size): which host slots hold copies of
// blocks evicted from the KV pool, keyed by the same block hash as the pool's cache (a hash names
// a whole prefix), with the block's tokens to tell a hash collision from a hit. Bookkeeping only:
// the model owns the host bytes (one slot = one pool block, every layer's K, V and index-K).
//   - store(): a block leaves the pool; it takes the least recently used slot (forgetting what
//     that slot held), unless its prefix is already stored;
//   - lookup(): a prefix the pool no longer holds, found here, is copied back into a pool block
//     instead of being recomputed; the copy stays (the tier is inclusive), so the block leaving
//     the pool again later costs no copy;
//   - a slot read by a copy still pending is pinned until the copies are handed to the model
//     (unpin_all), so no later store in the same step overwrites it;
//   - forget(): a copy into the slot failed, so it holds nothing.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace m3 {

class HostKvTier {
 public:
  HostKvTier(int64_t num_slots, int block_size);

  int64_t num_slots() const { return num_slots_; }
  int64_t num_stored() const { return static_cast<int64_t>(slot_of_.size()); }

  // The slot holding exactly `block_tokens` under `hash` (now the most recently used), or -1.
  int64_t lookup(uint64_t hash, std::span<const int32_t> block_tokens);
  // Whether some slot is recorded under `hash` (the recency of use is left as it is).
  bool holds(uint64_t hash) const { return slot_of_.count(hash) > 0; }
  // The slot to copy a block leaving the pool into, now recorded under `hash`: the least recently
  // used unpinned slot. -1, copying nothing, when the hash is already stored (it becomes the most
  // recently used) or every slot is pinned.
  int64_t store(uint64_t hash, std::span<const int32_t> block_tokens);
  void pin(int64_t slot);
  void unpin_all();
  // The slot becomes empty (the least recently used).
  void forget(int64_t slot);

 private:
  int64_t num_slots_;
  int block_size_;
  std::list<int64_t> lru_;  // slots, least recently used first (empty slots at the front)
  std::vector<std::list<int64_t>::iterator> pos_;
  std::vector<uint8_t> used_, pinned_;
  std::vector<uint64_t> hash_of_;
  std::vector<int32_t> tokens_;  // [num_slots, block_size]
  std::vector<int64_t> pinned_slots_;
  std::unordered_map<uint64_t, int64_t> slot_of_;
};

}  // namespace m3
