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
// Indexer decode context parallelism (DCP; docs/reference.md 2.4): the cp ranks of a tensor-
// parallel group, which all hold the whole index-K cache, split the blocks instead of each
// scanning all of them for its own index heads. Two ops around two all-gathers:
//   1. indexer_topk_candidates: with the index queries of every rank gathered ("parts": part p
//      holds the global index heads p*Hl .. p*Hl+Hl-1), rank r scores the blocks b <= L with
//      b % cp_size == r, for every head, exactly as indexer_topk scores them (query precision,
//      key decoding, dot order, max, forced blocks), and keeps the k = min(topk, ceil(seq_len /
//      block_size)) best as packed keys (below), in descending key order, then key 0 up to topk;
//   2. merge_topk_candidates: from every rank's candidates gathered, the rank's own part keeps the
//      topk largest non-zero keys of the cp_size * topk (that is k of them: when k < topk every
//      visible block is a candidate), decoded to block ids, ascending, then -1 padding: the output
//      contract of indexer_topk.
// Why the merged set is bitwise indexer_topk's:
//   - the ranking (score descending, then block id ascending) is a strict total order on blocks;
//     a block among the k best of all has fewer than k blocks above it, so fewer than k in its own
//     slice, and is among its slice's k best: the k best of the slices' k best are the k best;
//   - a block's score is a function of the query and that block's keys alone (no state shared
//     between blocks; kernels/cpu cpu_indexer_block_scores is the one definition both ops use), so
//     the split changes no bit of it;
//   - the key below compares exactly as that order, and is 0 where indexer_topk would give -1.
// The equality holds where both ops score alike: the CPU reference's two ops do, and the CUDA DCP
// kernels score bit for bit as the CPU; the CUDA backend's indexer_topk does not (the MSA kernels
// on tensor cores, the generic kernel summing in sequence), so on near-ties it may pick otherwise
// than DCP, as it may than the CPU reference.
//
// The candidate key (I64; larger = ranks higher; never negative, so signed and unsigned
// comparisons agree): key = ordered(score) << 31 | (0x7FFFFFFF - block), with ordered() the
// monotone map of fp32 onto uint32 (negative: all bits flipped; else the sign bit set) after
// reading -0 as +0 (they compare equal, so the block id must decide). Forced blocks carry score
// +inf, the value indexer_topk gives them, above every finite score. Blocks with no visible key
// (-inf) and empty slots are key 0 and never selected. Block ids: any int32 >= 0 (31 bits), not 16.
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
//
// draft_block_attention (the DSpark drafter, model/dspark.h): the planned step holds one block of
// block_len queries per sequence s (tokens s * block_len ..), at positions P + 1 .. P + block_len
// with P = seq_lens[s] - block_len - 1 its last context position. Query t at position q, head h
// (KV head g) attends, with logits dot(q, k) * sm_scale in fp32, to
//   - the cached keys of its sequence at positions max(0, q - window + 1) .. P (in position order;
//     K and V decoded exactly from f32, bf16 or fp8 caches, queries as given), then
//   - the block_k / block_v rows of every token of its block, later ones included (non-causal),
// softmax in fp32 (max, exp, sum in key order, weights divided by the sum), out = sum of weight * V
// in key order. The cache is read for positions <= P only: page-table entries past P's block may
// hold any block id.
#pragma once
#include <cstdint>

#include "core/hd.h"
#include "formats/bits.h"
#include "ops/kv_layout.h"
#include "ops/step_batch.h"

namespace m3 {

struct IndexerParams {
  int index_heads = 0;  // Hi, equal to the number of KV heads
  int topk_blocks = 16;
  int local_blocks = 1;
  int init_blocks = 0;
};

// ---- indexer DCP: the candidate key (see above), shared by every backend ----

// Whether block b of a query whose local block is `local` is forced (scores +inf): one of the
// local_blocks blocks local, local-1, ... or of the first init_blocks. Blocks past local are never
// visible and never forced.
M3_HD bool indexer_forced_block(int block, int local, const IndexerParams& p) {
  return block <= local && ((p.local_blocks > 0 && block > local - p.local_blocks) || block < p.init_blocks);
}

// The packed key of a block scoring `score` (+inf when forced); 0 for -inf (no visible key) and
// NaN (which indexer_topk's max never produces).
M3_HD int64_t indexer_candidate_key(float score, int32_t block) {
  if (!(score >= -3.40282347e38f)) return 0;  // below -FLT_MAX: -inf; or NaN
  uint32_t u = float_bits(score == 0.0f ? 0.0f : score);  // -0 ranks as +0
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return static_cast<int64_t>((static_cast<uint64_t>(u) << 31) | static_cast<uint64_t>(0x7FFFFFFF - block));
}

// The block id of a non-zero candidate key.
M3_HD int32_t indexer_candidate_block(int64_t key) {
  return 0x7FFFFFFF - static_cast<int32_t>(key & 0x7FFFFFFF);
}

}  // namespace m3
