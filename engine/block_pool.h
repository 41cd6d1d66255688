// The KV block pool's bookkeeping (no KV bytes here: the model owns those). Fixed set of
// physical blocks 0..n-1 with reference counts, a free list and the prefix cache:
//   - a full block's hash is xxh3_64 of its token ids seeded by the previous block's hash
//     (block_hash), so a hash names a whole prefix;
//   - full computed blocks are registered hash -> block; a later request with the same prefix
//     takes them (acquire) instead of recomputing;
//   - a block whose last reference goes stays cached on the free list: uncached blocks are
//     reused first, cached ones in least-recently-freed order, and a cached block is forgotten
//     only when it is reused for new contents (eviction).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace m3 {

// Seed of the chain for the first block of every sequence.
inline constexpr uint64_t kRootBlockHash = 0x6d33736572766531ull;  // "m3serve1"
uint64_t block_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens);

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, int block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Blocks nobody references (cached ones included): what allocate() can hand out.
  int64_t num_free() const { return num_free_; }
  int64_t num_used() const { return num_blocks_ - num_free_; }
  int64_t num_cached() const { return static_cast<int64_t>(cache_.size()); }

  // A free block for new contents, reference count 1; evicts its cache entry. Requires
  // num_free() > 0.
  int32_t allocate();
  // allocate(), saying which cached prefix it evicted: `evicted` gets the block's old hash (its
  // tokens stay readable with block_tokens() until the block is registered again), or nullopt.
  int32_t allocate(std::optional<uint64_t>& evicted);
  // The tokens a block was registered with.
  std::span<const int32_t> block_tokens(int32_t block) const {
    return {tokens_.data() + int64_t(block) * block_size_, static_cast<std::size_t>(block_size_)};
  }
  // The cached block holding exactly `block_tokens` under `hash`, or -1 (a hash collision with
  // other tokens is a miss).
  int32_t lookup(uint64_t hash, std::span<const int32_t> block_tokens) const;
  // One more reference to a block (a cache hit); takes it off the free list if it was free.
  void acquire(int32_t block);
  // One reference less; at zero the block joins the free list (cached: at the tail, to be
  // evicted last; uncached: at the head, to be reused first).
  void release(int32_t block);
  // Records a full, computed, referenced block under `hash`. No-op when the hash is already
  // cached (another block holds the same prefix) or the block already has a hash.
  void register_block(int32_t block, uint64_t hash, std::span<const int32_t> block_tokens);

  // Drops a block's cache entry (its contents cannot be trusted); it stays where it is.
  void forget(int32_t block);

  int ref_count(int32_t block) const { return ref_count_[block]; }
  bool is_cached(int32_t block) const { return has_hash_[block]; }
  // The hash a cached block is registered under (is_cached(block) must hold).
  uint64_t hash_of(int32_t block) const { return hash_of_[block]; }
  // Calls fn(block) for the first `limit` free blocks in the order allocate() hands them out
  // (uncached ones first, then cached ones, least recently freed first).
  template <class Fn>
  void for_each_next_free(int64_t limit, Fn&& fn) const {
    const int32_t sentinel = static_cast<int32_t>(num_blocks_);
    for (int32_t b = next_[sentinel]; b != sentinel && limit-- > 0; b = next_[b]) fn(b);
  }
  // Checks every invariant (ref counts vs free list, cache map vs block hashes); throws
  // m3::Error naming the first broken one. For tests and debug builds.
  void check_invariants() const;

 private:
  void list_remove(int32_t block);
  void list_push_front(int32_t block);
  void list_push_back(int32_t block);

  int64_t num_blocks_;
  int block_size_;
  int64_t num_free_ = 0;
  std::vector<int32_t> ref_count_;
  // Free list: doubly linked over block ids; index num_blocks_ is the sentinel.
  std::vector<int32_t> prev_, next_;
  std::vector<uint8_t> on_free_list_;
  std::vector<uint8_t> has_hash_;
  std::vector<uint64_t> hash_of_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size]: contents of cached blocks
  std::unordered_map<uint64_t, int32_t> cache_;
};

}  // namespace m3
