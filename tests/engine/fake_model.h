// A model stand-in for engine tests whose logits depend on every token of the context as read
// back through the page table, so any block-table, slot-mapping or prefix-cache mistake changes
// the output (or throws). Its "KV" per slot is (token, position); the logits of a row at
// position p are a pseudo-random function of the tokens at positions 0..p.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "engine/model_runner.h"

namespace m3::test {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The logits the fake gives after `context` (shared with tests that compute expectations).
inline void fake_logits(const std::vector<int32_t>& context, int vocab, float* out) {
  uint64_t h = 0x1234;
  for (int32_t t : context) h = mix64(h ^ static_cast<uint64_t>(t));
  for (int v = 0; v < vocab; ++v) {
    const uint64_t r = mix64(h + static_cast<uint64_t>(v) * 0x51ed27ull);
    out[v] = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53 * 8.0 - 4.0);
  }
}

class FakeModel final : public ModelRunner {
 public:
  FakeModel(int block_size, int64_t num_blocks, int vocab, int64_t max_positions = 1 << 20)
      : block_size_(block_size), num_blocks_(num_blocks), vocab_(vocab), max_positions_(max_positions),
        slot_token_(num_blocks * block_size, -1), slot_pos_(num_blocks * block_size, -1) {}

  int block_size() const override { return block_size_; }
  int64_t num_kv_blocks() const override { return num_blocks_; }
  int vocab_size() const override { return vocab_; }
  int64_t max_position_embeddings() const override { return max_positions_; }

  void forward(const StepBatch& b, float* logits) override {
    ++num_forwards;
    max_step_tokens = std::max(max_step_tokens, b.num_tokens());
    if (before_forward) before_forward(b);
    const int S = b.num_seqs();
    M3_CHECK(static_cast<int>(b.query_start.size()) == S + 1 && b.query_start[0] == 0 &&
                 b.query_start[S] == b.num_tokens(),
             "fake: bad query_start");
    M3_CHECK(static_cast<int64_t>(b.page_table.size()) == int64_t(S) * b.pages_per_seq, "fake: bad page table size");
    for (int s = 0; s < S; ++s) {
      const int q_len = b.query_start[s + 1] - b.query_start[s];
      M3_CHECK(q_len >= 1, "fake: empty sequence {}", s);
      const int pages = (b.seq_lens[s] + block_size_ - 1) / block_size_;
      M3_CHECK(pages <= b.pages_per_seq, "fake: page row too short");
      for (int pg = 0; pg < pages; ++pg) {
        const int32_t blk = b.page_table[s * b.pages_per_seq + pg];
        M3_CHECK(blk >= 0 && blk < num_blocks_, "fake: seq {} page {} has block {}", s, pg, blk);
      }
      for (int t = b.query_start[s]; t < b.query_start[s + 1]; ++t) {
        const int pos = b.seq_lens[s] - q_len + (t - b.query_start[s]);
        M3_CHECK(b.positions[t] == pos && b.token_seq[t] == s, "fake: token {} position/sequence mismatch", t);
        const int32_t blk = b.page_table[s * b.pages_per_seq + pos / block_size_];
        M3_CHECK(b.slot_mapping[t] == blk * block_size_ + pos % block_size_, "fake: token {} slot mismatch", t);
      }
    }
    for (int t = 0; t < b.num_tokens(); ++t) {
      slot_token_[b.slot_mapping[t]] = b.token_ids[t];
      slot_pos_[b.slot_mapping[t]] = b.positions[t];
    }
    std::vector<int32_t> context;
    for (std::size_t r = 0; r < b.logits_rows.size(); ++r) {
      const int t = b.logits_rows[r];
      const int s = b.token_seq[t];
      context.clear();
      for (int pos = 0; pos <= b.positions[t]; ++pos) {
        const int64_t slot = int64_t(b.page_table[s * b.pages_per_seq + pos / block_size_]) * block_size_ + pos % block_size_;
        M3_CHECK(slot_pos_[slot] == pos, "fake: slot {} holds position {}, expected {}", slot, slot_pos_[slot], pos);
        context.push_back(slot_token_[slot]);
      }
      fake_logits(context, vocab_, logits + r * vocab_);
    }
    total_logits_rows += b.logits_rows.size();
    total_tokens += b.num_tokens();
  }

  std::function<void(const StepBatch&)> before_forward;  // e.g. to throw, or to inspect
  int num_forwards = 0;
  int max_step_tokens = 0;
  uint64_t total_tokens = 0;
  uint64_t total_logits_rows = 0;

 private:
  int block_size_;
  int64_t num_blocks_;
  int vocab_;
  int64_t max_positions_;
  std::vector<int32_t> slot_token_;
  std::vector<int32_t> slot_pos_;
};

}  // namespace m3::test
