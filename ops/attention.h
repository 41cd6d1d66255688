// The attention-side operations of a MiniMax-M3 layer over a paged KV cache, and their exact
// semantics. The CPU reference (kernels/cpu/attention.cc) implements these definitions exactly;
// CUDA kernels (kernels/cuda/) are tested against it. All pointers are host pointers for the CPU
// backend and device pointers for CUDA.
//
// Positions: token t of sequence s sits at position p = positions[t]; its KV slot is
// slot_mapping[t] (block = slot / block_size, row = slot % block_size). Logical block b of
// sequence s is physical block page_table[s * pages_per_seq + b]. A query at position p sees keys
// at positions 0..p of its own sequence; its local block is L = p / block_size.
//
// kv_insert: writes K [T, Hkv, D], V [T, Hkv, D] and, for sparse layers, index-K [T, Di] of the
// step's tokens into their slots, encoded in the cache dtype: f32 copy; bf16 round to nearest
// even; fp8 E4M3 saturating round to nearest even; nvfp4 per formats/nvfp4.h (docs/reference.md D4).
//
// indexer_topk (sparse layers): per token t and index head j (= KV group j):
//   - index query precision: activation values for f32/bf16 index caches; cast to E4M3
//     (saturating, no scale) for fp8 and nvfp4 index caches;
//   - index keys: decoded from the cache (nvfp4: e2m1 * scale rounded to E4M3, the Q8KV4 view);
//   - score(b) = max over keys s of block b with s <= p of dot(iq[t, j], ik[s]) in fp32, no scale;
//     blocks with no visible key score -inf;
//   - forced blocks score +inf: the `local_blocks` blocks L, L-1, ... (clamped at 0) and the first
//     `init_blocks` blocks (when visible);
//   - keep the k = min(topk, ceil(seq_len / block_size)) highest scores; ties go to the lower
//     block id; slots whose score is -inf become -1;
//   - output [T, Hi, topk] int32: valid ids first, then -1 padding up to topk. The order among
//     the valid ids carries no meaning (attention reads the set; docs/reference.md D2): the CPU
//     reference lists them by descending score (ties ascending id), the MSA CUDA kernel by
//     ascending id.
// This is the transformers 5.17 reference generalised (its tie order is unspecified); with
// local_blocks >= 1 and no init blocks it equals the vendor kernels' contract.
//
// paged_attention: per token t and query head h (KV head g = h / (Hq / Hkv)): softmax attention
// of q[t, h] over the keys of its sequence at positions s <= p that lie in the blocks selected for
// (t, g) (`selection` [T, Hkv, topk], -1 entries ignored), or in all blocks when selection is null
// (full-attention layers). Logits = dot(q, k) * sm_scale.
//   - f32/bf16/fp8 KV: q as given, K and V decoded exactly to fp32, softmax and sums in fp32.
//   - nvfp4 KV ("Q8KV4", docs/reference.md D3): q' = E4M3(q) (saturating, no scale), K' and V' = the E4M3
//     view of the NVFP4 values; with m the row's max logit, p8 = E4M3(448 * exp((s - m)...)) i.e.
//     P8_i = E4M3(448 * exp(sm_scale * (q'.K'_i - m))), out = sum P8_i V'_i / sum 448 exp(...)
//     (the normaliser unquantised, docs/reference.md 3.2). Kernels that use a running max per block
//     agree within the tolerances of docs/reference.md 6.
//   - a row with no visible key outputs 0 and lse = -inf.
//   - lse (optional) = natural log of sum_i exp(sm_scale * logit_i).
#pragma once
#include <cstdint>

#include "ops/kv_layout.h"
#include "ops/step_batch.h"

namespace m3 {

struct IndexerParams {
  int index_heads = 0;  // Hi, equal to the number of KV heads
  int topk_blocks = 16;
  int local_blocks = 1;
  int init_blocks = 0;
};

}  // namespace m3
