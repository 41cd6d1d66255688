#include "engine/block_pool.h"

#include <algorithm>
#include <xxhash.h>

#include "core/error.h"

namespace m3 {

uint64_t block_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens) {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent_hash);
}

BlockPool::BlockPool(int64_t num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  M3_CHECK(num_blocks > 0 && num_blocks < INT32_MAX, "KV block pool: num_blocks must be in 1..2^31-2, got {}",
           num_blocks);
  M3_CHECK(block_size > 0, "KV block pool: block_size must be positive, got {}", block_size);
  ref_count_.assign(num_blocks, 0);
  prev_.assign(num_blocks + 1, 0);
  next_.assign(num_blocks + 1, 0);
  on_free_list_.assign(num_blocks, 0);
  has_hash_.assign(num_blocks, 0);
  hash_of_.assign(num_blocks, 0);
  tokens_.assign(num_blocks * block_size, 0);
  const int32_t sentinel = static_cast<int32_t>(num_blocks);
  prev_[sentinel] = next_[sentinel] = sentinel;
  for (int32_t b = 0; b < sentinel; ++b) list_push_back(b);
}

void BlockPool::list_remove(int32_t block) {
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  on_free_list_[block] = 0;
  --num_free_;
}

void BlockPool::list_push_front(int32_t block) {
  const int32_t sentinel = static_cast<int32_t>(num_blocks_);
  prev_[block] = sentinel;
  next_[block] = next_[sentinel];
  prev_[next_[sentinel]] = block;
  next_[sentinel] = block;
  on_free_list_[block] = 1;
  ++num_free_;
}

void BlockPool::list_push_back(int32_t block) {
  const int32_t sentinel = static_cast<int32_t>(num_blocks_);
  next_[block] = sentinel;
  prev_[block] = prev_[sentinel];
  next_[prev_[sentinel]] = block;
  prev_[sentinel] = block;
  on_free_list_[block] = 1;
  ++num_free_;
}

int32_t BlockPool::allocate() {
  std::optional<uint64_t> evicted;
  return allocate(evicted);
}

int32_t BlockPool::allocate(std::optional<uint64_t>& evicted) {
  evicted.reset();
  M3_CHECK(num_free_ > 0, "KV block pool: allocate with no free block (pool of {})", num_blocks_);
  const int32_t block = next_[num_blocks_];
  list_remove(block);
  if (has_hash_[block]) {  // evict: its old contents are about to be overwritten
    cache_.erase(hash_of_[block]);
    has_hash_[block] = 0;
    evicted = hash_of_[block];
  }
  ref_count_[block] = 1;
  return block;
}

int32_t BlockPool::lookup(uint64_t hash, std::span<const int32_t> block_tokens) const {
  const auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const int32_t* stored = tokens_.data() + int64_t(it->second) * block_size_;
  if (!std::equal(block_tokens.begin(), block_tokens.end(), stored)) return -1;
  return it->second;
}

void BlockPool::acquire(int32_t block) {
  if (ref_count_[block] == 0) list_remove(block);
  ++ref_count_[block];
}

void BlockPool::release(int32_t block) {
  M3_CHECK(ref_count_[block] > 0, "KV block pool: release of free block {}", block);
  if (--ref_count_[block] > 0) return;
  if (has_hash_[block]) {
    list_push_back(block);
  } else {
    list_push_front(block);
  }
}

void BlockPool::register_block(int32_t block, uint64_t hash, std::span<const int32_t> block_tokens) {
  if (has_hash_[block] || cache_.count(hash)) return;
  M3_CHECK(static_cast<int>(block_tokens.size()) == block_size_,
           "KV block pool: registering block {} with {} tokens (block size {})", block,
           block_tokens.size(), block_size_);
  cache_.emplace(hash, block);
  has_hash_[block] = 1;
  hash_of_[block] = hash;
  std::copy(block_tokens.begin(), block_tokens.end(), tokens_.begin() + int64_t(block) * block_size_);
}

void BlockPool::forget(int32_t block) {
  if (!has_hash_[block]) return;
  cache_.erase(hash_of_[block]);
  has_hash_[block] = 0;
}

void BlockPool::check_invariants() const {
  int64_t listed = 0;
  const int32_t sentinel = static_cast<int32_t>(num_blocks_);
  for (int32_t b = next_[sentinel]; b != sentinel; b = next_[b]) {
    M3_CHECK(ref_count_[b] == 0, "KV block pool: block {} on the free list has {} references", b,
             ref_count_[b]);
    M3_CHECK(on_free_list_[b], "KV block pool: block {} listed but not marked free", b);
    M3_CHECK(++listed <= num_blocks_, "KV block pool: free list has a cycle");
  }
  M3_CHECK(listed == num_free_, "KV block pool: free list holds {} blocks, counter says {}", listed,
           num_free_);
  for (int32_t b = 0; b < sentinel; ++b) {
    M3_CHECK((ref_count_[b] == 0) == bool(on_free_list_[b]),
             "KV block pool: block {} has {} references but free-list mark {}", b, ref_count_[b],
             on_free_list_[b]);
    if (has_hash_[b]) {
      const auto it = cache_.find(hash_of_[b]);
      M3_CHECK(it != cache_.end() && it->second == b, "KV block pool: block {} hash not mapped to it", b);
    }
  }
  for (const auto& [hash, b] : cache_) {
    M3_CHECK(has_hash_[b] && hash_of_[b] == hash, "KV block pool: cache entry for block {} is stale", b);
  }
}

}  // namespace m3
