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

// The planned step's metadata as pointers into arrays a kernel can read: the StepBatch's own
// vectors on the CPU, their device copies on the GPU. The one view of a step that backends and
// attention kernels take (by value into CUDA kernels: plain pointers and ints only).
struct StepView {
  int num_tokens = 0;
  int num_seqs = 0;
  const int32_t* positions = nullptr;     // [T]
  const int32_t* token_seq = nullptr;     // [T]
  const int32_t* seq_lens = nullptr;      // [S]
  const int32_t* page_table = nullptr;    // [S * pages_per_seq]
  int32_t pages_per_seq = 0;              // row stride of page_table (a backend may re-lay it)
  const int32_t* slot_mapping = nullptr;  // [T]
  int max_blocks = 0;  // an upper bound of ceil(seq_lens[s] / block_size) over the step (0: unknown)
};

// The view of `batch`'s own vectors (host pointers; max_blocks left 0).
inline StepView host_step_view(const StepBatch& batch) {
  StepView v;
  v.num_tokens = batch.num_tokens();
  v.num_seqs = batch.num_seqs();
  v.positions = batch.positions.data();
  v.token_seq = batch.token_seq.data();
  v.seq_lens = batch.seq_lens.data();
  v.page_table = batch.page_table.data();
  v.pages_per_seq = batch.pages_per_seq;
  v.slot_mapping = batch.slot_mapping.data();
  return v;
}

}  // namespace m3
