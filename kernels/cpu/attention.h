// The CPU reference of the attention-side ops of ops/attention.h (read it: it is the contract).
// Simple and exact: fp32 arithmetic, OpenMP over tokens and heads, no approximations. CUDA
// kernels are tested against these functions. All pointers are host pointers.
#pragma once
#include <cstdint>

#include "ops/attention.h"
#include "ops/kv_layout.h"

namespace m3 {

// Writes K, V [T, Hkv, D] and (when cache.index_dim > 0 and index_k is not null) index-K [T, Di]
// of every token into its slot, encoded in the cache dtypes. Tokens with slot_mapping < 0 are
// skipped (padding).
void cpu_kv_insert(const StepView& batch, const KvLayerView& cache, const float* k,
                   const float* v, const float* index_k);

// Block selection of the lightning indexer: out [T, Hi, params.topk_blocks] int32, valid block
// ids first (descending score, ties to the lower id), -1 padding.
void cpu_indexer_topk(const StepView& batch, const KvLayerView& cache,
                      const float* index_q, const IndexerParams& params, int32_t* out);

// Indexer DCP (ops/attention.h), step 1 on rank cp_rank of cp_size: index_q_parts [parts * T,
// Hi * Di] (part p: rows p*T .. p*T+T-1, Hi = params.index_heads heads each) -> candidates
// [parts, T, Hi, params.topk_blocks] packed keys of the blocks b % cp_size == cp_rank, descending,
// then 0.
void cpu_indexer_topk_candidates(const StepView& batch, const KvLayerView& cache,
                                 const float* index_q_parts, int parts, const IndexerParams& params,
                                 int cp_size, int cp_rank, int64_t* candidates);

// Indexer DCP, step 2: gathered [cp_size, parts, T, Hi, topk] keys -> selection [T, Hi, topk] of
// part `part`: block ids ascending, then -1.
void cpu_merge_topk_candidates(const StepView& batch, const int64_t* gathered, int cp_size,
                               int parts, int part, const IndexerParams& params, int32_t* selection);

// The pieces indexer_topk and the DCP candidates share, so that a block's score is one function of
// (query, block) whichever op asks. cpu_index_query_value: an index query element as it meets the
// cache (E4M3 for fp8/nvfp4 caches). cpu_indexer_block_scores: score[j * stride] for heads j of
// q [heads, Di] = max over the visible keys of `block` of the dot product (-inf if none are), for
// the token at `pos` whose page-table row is `pages`; key: scratch of Di floats.
float cpu_index_query_value(KvDType index_dtype, float x);
void cpu_indexer_block_scores(const KvLayerView& cache, const int32_t* pages, int pos, int block,
                              const float* q, int heads, float* key, float* score, int64_t stride);

// Exact paged attention over all visible keys (selection == null) or over the selected blocks
// (selection [T, Hkv, topk], -1 ignored). out [T, Hq, D]; lse [T, Hq] (natural log) or null.
void cpu_paged_attention(const StepView& batch, const KvLayerView& cache,
                         const float* q, int num_q_heads, const int32_t* selection, int topk,
                         float sm_scale, float* out, float* lse);

// The DSpark drafter's attention (ops/attention.h draft_block_attention): q [T, Hq, D], block_k /
// block_v [T, Hkv, D] (T = num_seqs * block_len) -> out [T, Hq, D].
void cpu_draft_block_attention(const StepView& batch, const KvLayerView& cache, const float* q, int num_q_heads,
                               const float* block_k, const float* block_v, int block_len, int window,
                               float sm_scale, float* out);

// Decodes one cached row (K, V or index-K) to fp32 exactly as stored: `e4m3_view` selects the
// Q8KV4 view of NVFP4 values (code * scale rounded to E4M3). Exposed for tests and kernels.
void cpu_kv_decode_row(KvDType dtype, const uint8_t* data, const uint8_t* scales, int dim,
                       bool e4m3_view, float* out);

}  // namespace m3
