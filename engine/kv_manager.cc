#include "engine/kv_manager.h"

#include <algorithm>
#include <span>

#include "core/error.h"

namespace m3 {

KvManager::KvManager(int64_t num_blocks, int block_size, bool enable_prefix_caching, int64_t host_slots,
                     int64_t save_ahead_blocks)
    : pool_(num_blocks, block_size), prefix_caching_(enable_prefix_caching) {
  M3_CHECK(host_slots >= 0, "KV host tier: {} slots", host_slots);
  M3_CHECK(save_ahead_blocks >= 0, "KV host tier: saving {} blocks ahead", save_ahead_blocks);
  if (host_slots > 0 && prefix_caching_) {
    host_.emplace(host_slots, block_size);
    save_ahead_blocks_ = save_ahead_blocks;
    saved_in_.assign(static_cast<std::size_t>(num_blocks), 0);
  }
}

void KvManager::save(int32_t block, int64_t slot, bool ahead) {
  (ahead ? pending_.to_host_ahead : pending_.to_host).push_back({block, slot});
  saved_in_[block] = batch_;
}

int32_t KvManager::allocate_block() {
  std::optional<uint64_t> evicted;
  const int32_t block = pool_.allocate(evicted);
  if (!host_) return block;
  if (evicted) {
    const int64_t slot = host_->store(*evicted, pool_.block_tokens(block));
    if (slot >= 0) save(block, slot, false);
  }
  // The next step writes this block: it must not overtake a copy of its old contents made ahead
  // in an earlier batch (one made now is in to_host, which the step waits for).
  if (saved_in_[block] > waited_batch_ && saved_in_[block] < batch_)
    pending_.wait_for_batch = std::max(pending_.wait_for_batch, saved_in_[block]);
  return block;
}

void KvManager::save_ahead() {
  pool_.for_each_next_free(save_ahead_blocks_, [&](int32_t block) {
    if (!pool_.is_cached(block) || host_->holds(pool_.hash_of(block))) return;
    const int64_t slot = host_->store(pool_.hash_of(block), pool_.block_tokens(block));
    if (slot < 0) return;
    save(block, slot, true);
    ++blocks_saved_ahead_;
  });
}

KvManager::Transfers KvManager::take_transfers() {
  if (host_) save_ahead();
  Transfers out;
  std::swap(out, pending_);
  out.batch = batch_++;
  if (host_) host_->unpin_all();
  waited_batch_ = std::max(waited_batch_, out.wait_for_batch);
  if (out.wait_for_batch > 0 || !out.to_host.empty()) ++steps_waiting_;
  blocks_to_host_ += out.to_host.size() + out.to_host_ahead.size();
  blocks_to_device_ += out.to_device.size();
  return out;
}

void KvManager::update_hashes(Sequence& seq) const {
  if (!prefix_caching_) return;
  const int bs = block_size();
  const std::size_t num_full = seq.tokens.size() / bs;
  while (seq.block_hashes.size() < num_full) {
    const std::size_t i = seq.block_hashes.size();
    const uint64_t parent = i == 0 ? kRootBlockHash : seq.block_hashes[i - 1];
    seq.block_hashes.push_back(block_hash(parent, std::span(seq.tokens).subspan(i * bs, bs)));
  }
}

void KvManager::drop_failed(const Transfers& transfers) {
  for (const KvBlockCopy& c : transfers.to_device) pool_.forget(static_cast<int32_t>(c.block));
  if (host_) {
    for (const KvBlockCopy& c : transfers.to_host) host_->forget(c.host_slot);
    for (const KvBlockCopy& c : transfers.to_host_ahead) host_->forget(c.host_slot);
  }
}

int KvManager::match_prefix(Sequence& seq) {
  M3_CHECK(seq.block_table.empty(), "request {}: prefix match on a sequence that holds blocks",
           seq.request.id);
  if (!prefix_caching_) return 0;
  const int bs = block_size();
  // The last token is always computed so that the step has logits to sample from.
  const std::size_t max_blocks = std::min<std::size_t>((seq.tokens.size() - 1) / bs, seq.block_hashes.size());
  for (std::size_t i = 0; i < max_blocks; ++i) {
    const std::span<const int32_t> tokens = std::span(seq.tokens).subspan(i * bs, bs);
    const int32_t block = pool_.lookup(seq.block_hashes[i], tokens);
    if (block >= 0) {
      pool_.acquire(block);
      seq.block_table.push_back(block);
      continue;
    }
    // Not in the pool: from the host tier, while free pool blocks last.
    const int64_t slot = host_ && pool_.num_free() > 0 ? host_->lookup(seq.block_hashes[i], tokens) : -1;
    if (slot < 0) break;
    host_->pin(slot);  // before allocate_block: the prefix it evicts may be stored into the tier
    const int32_t restored = allocate_block();
    pending_.to_device.push_back({restored, slot});
    pool_.register_block(restored, seq.block_hashes[i], tokens);
    seq.block_table.push_back(restored);
    seq.num_offload_hit_tokens += bs;
  }
  seq.num_registered_blocks = static_cast<int>(seq.block_table.size());
  seq.num_computed_tokens = static_cast<int>(seq.block_table.size()) * bs;
  return seq.num_computed_tokens;
}

bool KvManager::allocate(Sequence& seq, int num_total_tokens) {
  const int64_t needed = blocks_for(num_total_tokens) - static_cast<int64_t>(seq.block_table.size());
  if (needed <= 0) return true;
  if (needed > pool_.num_free()) return false;
  for (int64_t i = 0; i < needed; ++i) seq.block_table.push_back(allocate_block());
  return true;
}

void KvManager::commit_computed(Sequence& seq) {
  if (!prefix_caching_) return;
  const int bs = block_size();
  const int num_full = std::min<int>(seq.num_computed_tokens / bs, static_cast<int>(seq.block_hashes.size()));
  for (int i = seq.num_registered_blocks; i < num_full; ++i) {
    pool_.register_block(seq.block_table[i], seq.block_hashes[i], std::span(seq.tokens).subspan(i * bs, bs));
  }
  seq.num_registered_blocks = std::max(seq.num_registered_blocks, num_full);
}

void KvManager::trim(Sequence& seq, int num_tokens) {
  const auto keep = static_cast<std::size_t>(blocks_for(num_tokens));
  M3_CHECK(keep >= static_cast<std::size_t>(seq.num_registered_blocks),
           "request {}: trimming to {} tokens would drop registered blocks", seq.request.id, num_tokens);
  while (seq.block_table.size() > keep) {
    pool_.release(seq.block_table.back());
    seq.block_table.pop_back();
  }
}

void KvManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool_.release(*it);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_registered_blocks = 0;
}

}  // namespace m3
