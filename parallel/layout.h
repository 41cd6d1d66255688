// Which rank holds which slice of a model, for a ParallelConfig and a model's geometry (the
// scheme vLLM uses for MiniMax-M3, docs/reference.md 3.4):
//  - Ranks are numbered dp_rank * tp + tp_rank: the tp ranks of one data-parallel copy are
//    neighbours (on one host they share NVLink for the per-layer all-reduces).
//  - Attention: query heads split evenly over the tp ranks of a copy; KV heads split too, and
//    when tp exceeds the KV heads each KV head is replicated over tp / num_kv_heads ranks, so a
//    rank always holds the KV head its query heads read. A rank owns the index heads of its KV
//    groups; the index key is one head shared by all index heads, so every rank holds it whole.
//  - Dense MLP and shared expert: intermediate split over tp (gate/up by rows, down by columns).
//  - Embedding and lm_head: vocab-parallel over tp, the vocabulary padded up to a multiple of tp
//    so any vocabulary splits (padded rows are zeros; their logits are dropped before sampling).
//  - Routed experts: with expert parallel, EP size = tp x dp and each rank holds
//    num_experts / EP whole experts; without, every copy holds all experts with the intermediate
//    split over its tp ranks.
//  - DEP (--data-parallel-size N --enable-expert-parallel): attention is data-parallel, each copy
//    of tp ranks holds the attention, dense and shared-expert weights split over its tp ranks as
//    above (whole with -tp 1) and the KV of the requests it schedules (its KV heads split over its
//    tp ranks), while the routed experts are shared out across all tp x N ranks (by global rank).
// Sizes that do not divide fail here, at plan time, naming the option, the dimension and both values.
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/model_geometry.h"
#include "parallel/parallel_config.h"

namespace m3 {

// [begin, begin + size) of one dimension.
struct Slice {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
  bool operator==(const Slice&) const = default;
};

// What one rank holds. Slices index the model's full dimension (heads, experts, rows).
struct RankShard {
  int rank = 0;
  int tp_rank = 0;
  int dp_rank = 0;
  int ep_rank = -1;  // -1 without expert parallel
  Slice q_heads;
  Slice kv_heads;
  Slice index_heads;
  Slice dense_intermediate;
  Slice shared_intermediate;
  Slice experts;              // routed experts held (all of them without expert parallel)
  Slice expert_intermediate;  // of each held expert (the whole width with expert parallel)
  Slice vocab;                // rows of the padded vocabulary; may run past vocab_size (padding)
};

struct ParallelLayout {
  ParallelConfig config;
  ModelGeometry geometry;
  int expert_parallel_size = 1;  // tp x dp with expert parallel, else 1
  int kv_head_replicas = 1;      // ranks of a copy holding each KV head (tp / num_kv_heads when larger)
  int64_t padded_vocab_size = 0;
  std::vector<RankShard> ranks;  // world_size entries, by rank

  // Data-parallel attention: more than one copy schedules its own requests.
  bool attention_data_parallel() const { return config.data_parallel_size > 1; }
};

// Throws m3::Error naming the option and the dimension ("-tp 3: num_attention_heads 64 is not a
// multiple of 3").
ParallelLayout make_parallel_layout(const ParallelConfig& config, const ModelGeometry& geometry);

}  // namespace m3
