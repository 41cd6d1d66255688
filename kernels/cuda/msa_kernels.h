// Internal interface between MsaPlan (host, msa_plan.cc) and the CUDA kernels (*.cu): plain
// argument structs and launch functions. Work lists are built on the host by plan() and read by
// the kernels from device memory; launchers only enqueue work (no allocation, no synchronisation),
// so every run() call can be captured in a CUDA graph.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/kv_layout.h"
#include "ops/step_batch.h"

namespace m3::cuda::detail {

// Kernels are written for these sizes (MiniMax-M3: head_dim = index_dim = 128, page = 128).
inline constexpr int kDim = 128;         // head_dim and index_dim
inline constexpr int kTileTokens = 64;   // tokens staged per pipeline step; block_size % 64 == 0
inline constexpr int kMaxGroup = 16;     // query heads per KV head (one m16 MMA tile)
inline constexpr int kIndexerRows = 64;  // (query token, index head) rows per indexer work item
inline constexpr int kIndexerMaxBlocks = 64;  // blocks per indexer work item
inline constexpr int kDenseMaxBlocks = 256;   // blocks per dense attention work item
inline constexpr int kMaxSlotsPerItem = 32;  // selection slots one sparse attention item walks
inline constexpr int kMaxTilesPerBlock = 4;  // block_size <= 256

enum class ActKind : uint8_t { kBF16, kE4M3 };

// One CTA of the block-score kernel: rows [row_begin, row_begin + row_count) of one sequence
// (each row is a query token; the tile holds row_count * index_heads MMA rows) against logical
// blocks [block_begin, block_end) of that sequence.
struct IndexerWork {
  int32_t seq;
  int32_t row_begin;
  int32_t row_count;
  int32_t block_begin;
  int32_t block_end;
  int32_t pad[3];
};

// Rows of one sparse attention group: <= 4 rows of one sequence whose selections (<= 4 x topk
// candidate blocks) one CTA merges into their sorted union.
inline constexpr int kSparseGroupRows = 4;
inline constexpr int kSparseRowsAlone = 8;  // sequences of at most this many rows are not grouped
inline constexpr int kMaxGroupCandidates = 256;  // rows x topk of a group

// One CTA of sparse attention, KV head `kv_head`, rows [row, row + row_count) of one sequence.
//   row_count == 1: selection slots [begin, end) of that row; the 4 warps split each tile.
//   row_count 2..4: part `begin` of `end` equal parts of the sorted union of the rows' selected
//                   blocks; warp r owns row r and walks the tiles its row selected, so a tile
//                   two rows share is read once.
// partial < 0: write the final bf16 output; else row r writes partial index partial + r * partial_stride.
// combine >= 0 (a row alone split over slot ranges): the CombineWork of the row's splits; the
// sparse rows kernel's CTA that finishes last merges them (AttentionArgs::combine_work).
struct SparseWork {
  int32_t row;
  int32_t row_count;
  int32_t kv_head;
  int32_t begin;
  int32_t end;
  int32_t partial;
  int32_t partial_stride;
  int32_t combine;
};

// One CTA of dense attention: rows [row_begin, row_begin + row_count) (<= 4) of sequence `seq`,
// KV head `kv_head`, logical blocks [block_begin, block_end). partial < 0: final output; else row r
// writes partial index partial + r * partial_stride.
struct DenseWork {
  int32_t seq;
  int32_t row_begin;
  int32_t row_count;
  int32_t kv_head;
  int32_t block_begin;
  int32_t block_end;
  int32_t partial;
  int32_t partial_stride;
};

// Merge of split partial results for (row, kv_head): partials [partial_begin, +num_splits).
struct CombineWork {
  int32_t row;
  int32_t kv_head;
  int32_t partial_begin;
  int32_t num_splits;
};

struct KvInsertArgs {
  KvLayerView cache;
  StepView step;
  int num_tokens = 0;
  const uint16_t* k = nullptr;        // bf16 [T, Hkv, D]
  const uint16_t* v = nullptr;        // bf16 [T, Hkv, D]
  const uint16_t* index_k = nullptr;  // bf16 [T, Di] or null
};

struct IndexerArgs {
  KvLayerView cache;
  StepView step;
  const void* index_q = nullptr;  // [T, Hi, Di] bf16 or e4m3
  ActKind q_kind = ActKind::kBF16;
  int index_heads = 0;
  int local_blocks = 1;  // forced blocks need no score (the top-k kernel ignores them)
  const IndexerWork* work = nullptr;
  int num_work = 0;  // CTAs launched
  // Graph mode: the real item count on the device (CTAs from it on exit); null: num_work items.
  const int32_t* device_num_work = nullptr;
  const int32_t* score_offset = nullptr;  // [T]: first score entry of token t (times index_heads)
  float* scores = nullptr;
  const uint2* e4m3_table = nullptr;  // [256]: E4M3(e2m1 magnitude * scale) bytes per scale byte
  bool probe_skip_decode = false;     // timing probe (nvfp4): raw code words fed to the MMA
};

struct TopkArgs {
  StepView step;
  int num_tokens = 0;
  int index_heads = 0;
  int block_size = 0;
  int topk = 0;
  int local_blocks = 1;
  int init_blocks = 0;
  const int32_t* score_offset = nullptr;
  const float* scores = nullptr;
  int32_t* out = nullptr;  // [T, Hi, topk]
  int max_candidates = 0;  // largest (L + 1) of the step, sizes shared memory
};

struct AttentionArgs {
  KvLayerView cache;
  StepView step;
  const void* q = nullptr;  // [T, Hq, D] bf16 or e4m3
  ActKind q_kind = ActKind::kBF16;
  int num_q_heads = 0;
  const int32_t* selection = nullptr;  // [T, Hkv, topk] (sparse only)
  int topk = 0;
  float sm_scale = 0.0f;
  uint16_t* out = nullptr;  // bf16 [T, Hq, D]
  float* lse = nullptr;     // [T, Hq] or null
  const void* work = nullptr;  // SparseWork or DenseWork
  int num_work = 0;                          // CTAs launched
  const int32_t* device_num_work = nullptr;  // graph mode: real count on the device (see IndexerArgs)
  float* partial_o = nullptr;   // [P, kMaxGroup, D] unnormalised outputs
  float* partial_ml = nullptr;  // [P, kMaxGroup, 2]: running max (raw dot units), normaliser
  const uint2* e4m3_table = nullptr;
  bool probe_skip_expand = false;  // timing probe (sparse, nvfp4): K/V tiles not expanded
  // The sparse rows kernel's merge of a row's splits (SparseWork::combine): the combine list and
  // one arrival counter per item, zero between launches (the last CTA to arrive sets it back).
  const CombineWork* combine_work = nullptr;
  int32_t* combine_done = nullptr;
};

struct CombineArgs {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  float sm_scale = 0.0f;
  bool nvfp4 = false;  // the normaliser carries the 448 factor of the probability path
  const CombineWork* work = nullptr;
  int num_work = 0;                          // CTAs launched
  const int32_t* device_num_work = nullptr;  // graph mode: real count on the device (see IndexerArgs)
  const float* partial_o = nullptr;
  const float* partial_ml = nullptr;
  uint16_t* out = nullptr;
  float* lse = nullptr;
};

// Once per process and device, before the first launch: raises the kernels' shared-memory limits.
cudaError_t init_indexer_kernels();
cudaError_t init_topk_kernels();
cudaError_t init_attention_kernels();
cudaError_t init_sparse_rows_kernel();
cudaError_t init_sparse_groups_kernel();

// CTAs of the indexer / sparse attention kernel for this cache dtype that fit on one
// multiprocessor at once (for sizing work lists to whole waves).
int indexer_ctas_per_sm(KvDType index_dtype);
int sparse_attention_ctas_per_sm(KvDType kv_dtype);
int sparse_rows_ctas_per_sm();
int sparse_groups_ctas_per_sm();

cudaError_t build_e4m3_table(uint2* table, cudaStream_t stream);
cudaError_t launch_kv_insert(const KvInsertArgs& args, cudaStream_t stream);
cudaError_t launch_indexer_scores(const IndexerArgs& args, cudaStream_t stream);
cudaError_t launch_topk(const TopkArgs& args, cudaStream_t stream);
cudaError_t launch_sparse_attention(const AttentionArgs& args, cudaStream_t stream);
// Rows alone (SparseWork row_count 1) over an NVFP4 cache, on wgmma (sparse_rows.cu).
cudaError_t launch_sparse_rows(const AttentionArgs& args, cudaStream_t stream);
// Row groups (SparseWork row_count 2..4) over an NVFP4 cache, on wgmma (sparse_groups.cu).
cudaError_t launch_sparse_groups(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_dense_attention(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_combine(const CombineArgs& args, cudaStream_t stream);

}  // namespace m3::cuda::detail
