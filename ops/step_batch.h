// StepBatch: one engine step, flattened. Several sequences, each contributing a prefill chunk or
// decode tokens, back to back. Plain data: the engine fills it, the model and backends read it.
//
// Invariants: a sequence's tokens are consecutive and are its last q_len positions, i.e.
// positions = seq_lens[s] - q_len .. seq_lens[s] - 1 (bottom-right aligned, as chunked prefill
// and speculative verification need). page_table rows cover ceil(seq_lens[s] / block_size) pages.
#pragma once
#include <cstdint>
#include <vector>

namespace m3 {

struct StepBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T] absolute position in its sequence
  std::vector<int32_t> token_seq;     // [T] which sequence (0..S-1) the token belongs to
  std::vector<int32_t> query_start;   // [S+1] tokens of sequence s: [query_start[s], query_start[s+1])
  std::vector<int32_t> seq_lens;      // [S] KV length after this step, new tokens included
  std::vector<int32_t> page_table;    // [S * pages_per_seq] logical block -> physical block
  int32_t pages_per_seq = 0;          // row stride of page_table
  std::vector<int32_t> slot_mapping;  // [T] physical slot = block * block_size + offset of token t
  std::vector<int32_t> logits_rows;   // token rows whose logits are wanted, in output order

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
};

}  // namespace m3
