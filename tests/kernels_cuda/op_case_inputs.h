// Host inputs shared by the op case tables: the two geometries of the op checks, steps over
// several page-table layouts, KV pools encoded by the CPU reference, valid sparse selections.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/kv_layout.h"
#include "ops/step_batch.h"
#include "tests/kernels_cuda/backend_testing.h"
#include "tests/kernels_cuda/msa_testing.h"

namespace m3::test {

using cuda::testing::PageLayout;
using cuda::testing::SeqSpec;

// The M3 shape (head_dim = index_dim = 128, block 128: the CUDA backend takes the MSA kernels)
// and a tiny one (the generic kernels).
Geometry m3_geometry();
Geometry tiny_geometry();

// A step over `seqs` with pages laid out per `layout` (msa_testing.h), random token ids below
// `vocab`, the last token of each sequence as its logits row; num_blocks: the pool it needs.
struct Step {
  StepBatch batch;
  int num_blocks = 0;
};
Step make_step(const std::vector<SeqSpec>& seqs, int block_size, PageLayout layout, int shared_prefix_blocks,
               int vocab, std::mt19937_64& rng);

// A host KV pool (U8 [num_blocks * block_bytes], one layer) whose every slot before each
// sequence's step tokens (with_step_tokens: every slot up to seq_len) holds random K, V and
// index-K rows (N(0, 1), bf16) encoded by the CPU reference; the other bytes are 0x5a.
Tensor encode_pool(const KvLayout& layout, const StepBatch& step, int num_blocks, bool with_step_tokens,
                   std::mt19937_64& rng);

// A valid selection I32 [T, heads, topk] for the step: per row min(topk, visible blocks) distinct
// causally visible blocks, always the token's own, ascending, then -1 (the MSA kernels' order).
Tensor random_selection(const StepBatch& step, int block_size, int heads, int topk, std::mt19937_64& rng);

// Whether each token belongs to a decode row (a sequence with <= 16 new tokens this step).
std::vector<bool> decode_tokens(const StepBatch& step);

}  // namespace m3::test
