// SimpleKvAllocator: KV block bookkeeping for tests that drive MiniMaxM3 or a backend directly,
// without the engine: a free list of the pool's blocks, no prefix sharing, no preemption. It
// builds StepBatches that satisfy the StepBatch invariants (ops/step_batch.h), page-table rows
// padded with -1 as the engine's step builder pads them. The engine has its own block pool.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/step_batch.h"

namespace m3 {

// Tokens appended to one sequence in one step.
struct StepChunk {
  int seq = 0;
  std::vector<int32_t> tokens;
  bool all_logits = false;  // logits for every token of the chunk (scoring), else the last only
};

class SimpleKvAllocator {
 public:
  SimpleKvAllocator(int64_t num_blocks, int block_size);

  int add_sequence();  // a new empty sequence; returns its handle
  void free_sequence(int seq);
  int64_t length(int seq) const;
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // One step with the given chunks (distinct sequences), allocating the blocks they need; the
  // sequences' lengths grow by their chunk sizes. Logit rows come in chunk order. Throws m3::Error
  // when the pool runs out of blocks.
  StepBatch build_step(const std::vector<StepChunk>& chunks);

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  int block_size_;
  std::vector<int32_t> free_;  // a stack: lowest ids are handed out first
  std::vector<Sequence> seqs_;
};

}  // namespace m3
