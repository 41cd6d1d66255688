#include "tests/support/simple_kv_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace m3 {

SimpleKvAllocator::SimpleKvAllocator(int64_t num_blocks, int block_size) : block_size_(block_size) {
  M3_CHECK(num_blocks > 0 && block_size > 0, "KV allocator needs blocks (got {} x {})", num_blocks,
           block_size);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int SimpleKvAllocator::add_sequence() {
  seqs_.push_back(Sequence{true, 0, {}});
  return static_cast<int>(seqs_.size()) - 1;
}

void SimpleKvAllocator::free_sequence(int seq) {
  M3_CHECK(seq >= 0 && seq < static_cast<int>(seqs_.size()) && seqs_[seq].live,
           "unknown sequence {}", seq);
  Sequence& s = seqs_[seq];
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s = Sequence{};
}

int64_t SimpleKvAllocator::length(int seq) const {
  M3_CHECK(seq >= 0 && seq < static_cast<int>(seqs_.size()) && seqs_[seq].live,
           "unknown sequence {}", seq);
  return seqs_[seq].length;
}

StepBatch SimpleKvAllocator::build_step(const std::vector<StepChunk>& chunks) {
  StepBatch b;
  b.query_start.push_back(0);
  size_t max_pages = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const StepChunk& c = chunks[i];
    M3_CHECK(c.seq >= 0 && c.seq < static_cast<int>(seqs_.size()) && seqs_[c.seq].live,
             "step chunk {}: unknown sequence {}", i, c.seq);
    for (size_t j = 0; j < i; ++j)
      M3_CHECK(chunks[j].seq != c.seq, "sequence {} appears twice in one step", c.seq);
    Sequence& s = seqs_[c.seq];
    const int64_t new_len = s.length + static_cast<int64_t>(c.tokens.size());
    const size_t pages = static_cast<size_t>((new_len + block_size_ - 1) / block_size_);
    while (s.blocks.size() < pages) {
      M3_CHECK(!free_.empty(), "KV cache full: sequence {} needs {} blocks ({} tokens)", c.seq,
               pages, new_len);
      s.blocks.push_back(free_.back());
      free_.pop_back();
    }
    max_pages = std::max(max_pages, pages);
    const int seq_index = static_cast<int>(i);
    for (size_t j = 0; j < c.tokens.size(); ++j) {
      const int64_t pos = s.length + static_cast<int64_t>(j);
      if (c.all_logits || j + 1 == c.tokens.size()) b.logits_rows.push_back(b.num_tokens());
      b.token_ids.push_back(c.tokens[j]);
      b.positions.push_back(static_cast<int32_t>(pos));
      b.token_seq.push_back(seq_index);
      b.slot_mapping.push_back(s.blocks[pos / block_size_] * block_size_ + pos % block_size_);
    }
    s.length = new_len;
    b.seq_lens.push_back(static_cast<int32_t>(new_len));
    b.query_start.push_back(b.num_tokens());
  }
  b.pages_per_seq = static_cast<int32_t>(std::max<size_t>(max_pages, 1));
  b.page_table.assign(chunks.size() * b.pages_per_seq, -1);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& blocks = seqs_[chunks[i].seq].blocks;
    std::copy(blocks.begin(), blocks.end(), b.page_table.begin() + i * b.pages_per_seq);
  }
  return b;
}

}  // namespace m3
