#include "engine/kv_manager.h"

#include <span>

#include "core/error.h"

namespace m3 {

KvManager::KvManager(int64_t num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks, block_size), prefix_caching_(enable_prefix_caching) {}

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

int KvManager::match_prefix(Sequence& seq) {
  M3_CHECK(seq.block_table.empty(), "request {}: prefix match on a sequence that holds blocks",
           seq.request.id);
  if (!prefix_caching_) return 0;
  const int bs = block_size();
  // The last token is always computed so that the step has logits to sample from.
  const std::size_t max_blocks = std::min<std::size_t>((seq.tokens.size() - 1) / bs, seq.block_hashes.size());
  for (std::size_t i = 0; i < max_blocks; ++i) {
    const int32_t block = pool_.lookup(seq.block_hashes[i], std::span(seq.tokens).subspan(i * bs, bs));
    if (block < 0) break;
    pool_.acquire(block);
    seq.block_table.push_back(block);
  }
  seq.num_registered_blocks = static_cast<int>(seq.block_table.size());
  seq.num_computed_tokens = static_cast<int>(seq.block_table.size()) * bs;
  return seq.num_computed_tokens;
}

bool KvManager::allocate(Sequence& seq, int num_total_tokens) {
  const int64_t needed = blocks_for(num_total_tokens) - static_cast<int64_t>(seq.block_table.size());
  if (needed <= 0) return true;
  if (needed > pool_.num_free()) return false;
  for (int64_t i = 0; i < needed; ++i) seq.block_table.push_back(pool_.allocate());
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

void KvManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool_.release(*it);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
  seq.num_registered_blocks = 0;
}

}  // namespace m3
