// Sequence-level KV block management over the BlockPool: block tables, prefix-cache matching
// and registration. Bookkeeping only; the scheduler decides who gets blocks.
#pragma once
#include <cstdint>

#include "engine/block_pool.h"
#include "engine/sequence.h"

namespace m3 {

class KvManager {
 public:
  KvManager(int64_t num_blocks, int block_size, bool enable_prefix_caching);

  const BlockPool& pool() const { return pool_; }
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

 private:
  BlockPool pool_;
  bool prefix_caching_;
};

}  // namespace m3
