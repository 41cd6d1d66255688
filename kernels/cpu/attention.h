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

// Exact paged attention over all visible keys (selection == null) or over the selected blocks
// (selection [T, Hkv, topk], -1 ignored). out [T, Hq, D]; lse [T, Hq] (natural log) or null.
void cpu_paged_attention(const StepView& batch, const KvLayerView& cache,
                         const float* q, int num_q_heads, const int32_t* selection, int topk,
                         float sm_scale, float* out, float* lse);

// Decodes one cached row (K, V or index-K) to fp32 exactly as stored: `e4m3_view` selects the
// Q8KV4 view of NVFP4 values (code * scale rounded to E4M3). Exposed for tests and kernels.
void cpu_kv_decode_row(KvDType dtype, const uint8_t* data, const uint8_t* scales, int dim,
                       bool e4m3_view, float* out);

}  // namespace m3
