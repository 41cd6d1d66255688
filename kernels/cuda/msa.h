// MiniMax Sparse Attention on Hopper (sm_90a): the CUDA side of the attention ops of
// ops/attention.h (semantics there; the CPU reference in kernels/cpu/attention.h is the oracle).
// Kernels: kv_insert.cu, indexer.cu (block scores; wgmma on fp8/nvfp4 index caches), topk.cu,
// sparse_rows.cu and sparse_groups.cu (rows alone and row groups over an NVFP4 cache, wgmma; what
// they share in sparse_nvfp4.cuh, the groups' union in sparse_union.cuh), attention.cu (other KV
// dtypes, dense attention, the merge of splits); msa_schedule.cc builds each step's work lists,
// msa_plan.cc uploads them and launches.
//
//   MsaPlan plan(config);                  // once: builds tables, raises kernel limits
//   plan.plan(host_step, device_view, s);  // once per step, outside graph capture: schedules
//   per layer (all capturable: no allocation, no synchronisation):
//     plan.kv_insert(cache, k, v, index_k, s);
//     plan.indexer_topk(cache, index_q, ActDType::kBF16, selection, s);   // sparse layers
//     plan.attention(cache, q, ActDType::kBF16, selection, sm_scale, out, lse, s);
//
// Tensors (device pointers, contiguous, 16-byte aligned): k/v [T, Hkv, D] bf16, index_k [T, Di]
// bf16, index_q [T, Hi, Di] and q [T, Hq, D] bf16 or E4M3 (ActDType), selection [T, Hkv, topk]
// int32 (valid ids ascending, then -1), out [T, Hq, D] bf16, lse [T, Hq] fp32 (natural log).
// Limits: head_dim = index_dim = 128, block_size a multiple of 64 up to 256, Hq / Hkv <= 16,
// topk <= 128, KV and index caches in bf16, fp8 or nvfp4 (insert also writes f32).
//
// plan() grows its device workspaces when a step needs more than any step before; it then bumps
// generation(), and CUDA graphs captured earlier must be captured again.
//
// Graph mode (plan(..., graph_pages_per_seq = P > 0)): every by-value launch argument and every
// workspace offset depends only on (tokens, sequences, P), so launches recorded in a CUDA graph
// stay valid for any later step of that shape whose sequences need at most P pages: the work
// lists sit at fixed offsets padded to upper bounds, grids launch those bounds and the kernels
// read the real item counts from device memory (surplus CTAs exit), top-k shared memory is sized
// for P candidate blocks, and the workspaces are reserved for the bounds.
#pragma once
#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "ops/attention.h"
#include "ops/step_batch.h"

namespace m3::cuda {

enum class ActDType : uint8_t { kBF16, kE4M3 };

struct MsaConfig {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;
  int index_dim = 128;  // 0: no sparse layers
  int block_size = 128;
  IndexerParams indexer;  // index_heads, topk_blocks, local_blocks, init_blocks
  bool dense = true;      // also schedule dense (full) attention, selection = null
  // Batch-invariant mode (CudaBackendOptions::batch_invariant): every split of a row's work is a
  // function of that row's own context, never of the step's size or the SM count. Sparse
  // attention takes every row alone (no row groups) with the fewest slot splits
  // (ceil(topk / kMaxSlotsPerItem)); dense attention
  // chunks each row's blocks at fixed multiples of kDenseMaxBlocks and never groups rows whose
  // chunk counts differ. The indexer's block chunks need no such rule: a block's score (a max)
  // is computed whole inside one item.
  bool batch_invariant = false;
};

class MsaPlan {
 public:
  explicit MsaPlan(const MsaConfig& config);
  ~MsaPlan();
  MsaPlan(const MsaPlan&) = delete;
  MsaPlan& operator=(const MsaPlan&) = delete;

  // `host` is the step on the host; `device` views the same arrays copied to the device (the
  // runner owns them; they must stay valid while run calls of this step execute).
  // graph_pages_per_seq: 0, or graph mode for steps whose sequences need <= that many pages.
  void plan(const StepBatch& host, const StepView& device, cudaStream_t stream,
            int graph_pages_per_seq = 0);
  int64_t generation() const;

  void kv_insert(const KvLayerView& cache, const uint16_t* k, const uint16_t* v,
                 const uint16_t* index_k, cudaStream_t stream) const;
  // Block scores then top-k: indexer_scores() + topk().
  void indexer_topk(const KvLayerView& cache, const void* index_q, ActDType q_dtype,
                    int32_t* selection, cudaStream_t stream) const;
  void indexer_scores(const KvLayerView& cache, const void* index_q, ActDType q_dtype,
                      cudaStream_t stream) const;
  void topk(int32_t* selection, cudaStream_t stream) const;
  // selection == nullptr: dense attention over every visible block.
  void attention(const KvLayerView& cache, const void* q, ActDType q_dtype, const int32_t* selection,
                 float sm_scale, uint16_t* out, float* lse, cudaStream_t stream) const;

  // Timing probes for msa_bench ("time variants that leave one stage out"): with a flag set the
  // nvfp4 kernels skip that stage and their results are WRONG. Never set outside benchmarks.
  struct TimingProbe {
    bool skip_index_decode = false;  // indexer: nvfp4 codes fed to the MMA undecoded
    bool skip_kv_expand = false;     // sparse attention: nvfp4 K/V tiles not expanded
  };
  void set_timing_probe(const TimingProbe& probe);

  // Schedule facts for benchmarks and logs.
  struct Stats {
    int indexer_items = 0, sparse_items = 0, dense_items = 0, combine_sparse = 0, combine_dense = 0;
    int sparse_splits = 1;  // slot splits of a row alone
    int sparse_parts = 1;   // parts of a row group's union of blocks
    int64_t score_entries = 0;
    int indexer_launch = 0, dense_launch = 0, combine_dense_launch = 0;  // CTAs (graph mode: bounds)
    int sparse_group_items = 0, sparse_row_items = 0;
    int sparse_group_launch = 0, sparse_row_launch = 0, combine_sparse_launch = 0;
    // The sparse combine launch beside the NVFP4 kernels: the row groups' merges only (rows alone
    // merge in the sparse rows kernel).
    int combine_sparse_group_launch = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::cuda
