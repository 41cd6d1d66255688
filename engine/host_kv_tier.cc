#include "engine/host_kv_tier.h"

#include <algorithm>

#include "core/error.h"

namespace m3 {

HostKvTier::HostKvTier(int64_t num_slots, int block_size) : num_slots_(num_slots), block_size_(block_size) {
  M3_CHECK(num_slots > 0, "KV host tier: needs at least one slot, got {}", num_slots);
  M3_CHECK(block_size > 0, "KV host tier: block_size must be positive, got {}", block_size);
  pos_.resize(num_slots);
  for (int64_t s = 0; s < num_slots; ++s) pos_[s] = lru_.insert(lru_.end(), s);
  used_.assign(num_slots, 0);
  pinned_.assign(num_slots, 0);
  hash_of_.assign(num_slots, 0);
  tokens_.assign(static_cast<std::size_t>(num_slots) * block_size, 0);
}

int64_t HostKvTier::lookup(uint64_t hash, std::span<const int32_t> block_tokens) {
  const auto it = slot_of_.find(hash);
  if (it == slot_of_.end()) return -1;
  const int64_t slot = it->second;
  const int32_t* stored = tokens_.data() + slot * block_size_;
  if (!std::equal(block_tokens.begin(), block_tokens.end(), stored)) return -1;
  lru_.splice(lru_.end(), lru_, pos_[slot]);
  return slot;
}

int64_t HostKvTier::store(uint64_t hash, std::span<const int32_t> block_tokens) {
  M3_CHECK(static_cast<int>(block_tokens.size()) == block_size_, "KV host tier: storing {} tokens (block size {})",
           block_tokens.size(), block_size_);
  if (const auto it = slot_of_.find(hash); it != slot_of_.end()) {
    lru_.splice(lru_.end(), lru_, pos_[it->second]);
    return -1;
  }
  auto victim = std::find_if(lru_.begin(), lru_.end(), [&](int64_t s) { return !pinned_[s]; });
  if (victim == lru_.end()) return -1;
  const int64_t slot = *victim;
  if (used_[slot]) slot_of_.erase(hash_of_[slot]);
  used_[slot] = 1;
  hash_of_[slot] = hash;
  std::copy(block_tokens.begin(), block_tokens.end(), tokens_.begin() + slot * block_size_);
  slot_of_.emplace(hash, slot);
  lru_.splice(lru_.end(), lru_, victim);
  return slot;
}

void HostKvTier::forget(int64_t slot) {
  M3_CHECK(slot >= 0 && slot < num_slots_, "KV host tier: forget slot {} of {}", slot, num_slots_);
  if (!used_[slot]) return;
  slot_of_.erase(hash_of_[slot]);
  used_[slot] = 0;
  lru_.splice(lru_.begin(), lru_, pos_[slot]);
}

void HostKvTier::pin(int64_t slot) {
  if (pinned_[slot]) return;
  pinned_[slot] = 1;
  pinned_slots_.push_back(slot);
}

void HostKvTier::unpin_all() {
  for (int64_t s : pinned_slots_) pinned_[s] = 0;
  pinned_slots_.clear();
}

}  // namespace m3
