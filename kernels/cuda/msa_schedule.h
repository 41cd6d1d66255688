// The MSA kernels' per-step work lists, built on the host from the step's query ranges and
// positions (no CUDA calls, so tests check them without a GPU: tests/kernels_cuda/msa_schedule_test):
//   indexer: row tiles of <= 64 MMA rows x chunks of the blocks their rows need scored;
//   sparse attention: rows alone x slot ranges (sequences of <= kSparseRowsAlone rows), row
//     groups x parts of their union (longer sequences: prefill chunks);
//   dense attention: row groups of <= 4 x block chunks;
//   the merges (CombineWork) of every (row, KV head) split in several pieces.
// Item counts are sized to whole waves of CTAs (MsaSlots: how many of each kernel run at once).
// Graph mode (graph_pages_per_seq = P > 0): the caps bound the lists for any step of the same
// (tokens, sequences) whose sequences need at most P pages; MsaPlan launches the caps.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/msa.h"
#include "kernels/cuda/msa_kernels.h"

namespace m3::cuda {

struct MsaSlots {
  int sms = 1;
  int indexer = 1, sparse_rows = 1, sparse_groups = 1;  // CTAs of each kernel at once (SMs x per SM)
};

struct MsaSchedule {
  std::vector<int32_t> score_offset;  // [T]: first score entry of token t (times index heads)
  int64_t score_entries = 0, score_capacity = 0;
  int max_candidates = 1;  // largest (block of the last position + 1) of the step
  std::vector<detail::IndexerWork> indexer;
  std::vector<detail::SparseWork> sparse_groups, sparse_rows;
  // sparse_combine: the row groups' merges (the first sparse_group_combines), then the rows
  // alone's (SparseWork::combine names them).
  std::vector<detail::CombineWork> sparse_combine, dense_combine;
  int sparse_group_combines = 0;
  std::vector<detail::DenseWork> dense;
  int sparse_splits = 1, sparse_parts = 1;
  int64_t sparse_partials = 0, dense_partials = 0;  // partial results to reserve
  // Graph mode's bounds (0 otherwise).
  int indexer_cap = 0, sparse_groups_cap = 0, sparse_rows_cap = 0, sparse_combine_cap = 0, dense_cap = 0,
      dense_combine_cap = 0, sparse_group_combine_cap = 0;
};

MsaSchedule build_msa_schedule(const MsaConfig& config, const StepBatch& step, const MsaSlots& slots,
                               int graph_pages_per_seq);

}  // namespace m3::cuda
