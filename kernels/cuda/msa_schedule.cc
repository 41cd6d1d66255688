// The MSA kernels' per-step work lists (host side, no CUDA calls): see msa_schedule.h.
#include "kernels/cuda/msa_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace m3::cuda {
namespace {

using detail::CombineWork;
using detail::DenseWork;
using detail::IndexerWork;
using detail::SparseWork;

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Splits (min_splits..max_splits) of `items` equal work items of `work` units each for `slots` CTAs that
// run at once, where a CTA also pays `overhead` units (its prologue, the pipeline's fill): the
// count whose waves come closest to the work, time ~ ceil(items * s / slots) * (work / s +
// overhead), the fewest on ties (each split costs a partial result and its merge).
int wave_splits(int64_t items, int64_t slots, int min_splits, int max_splits, double work, double overhead) {
  max_splits = std::max(min_splits, max_splits);
  if (items <= 0) return min_splits;
  int best = min_splits;
  double best_time = 1e300;
  for (int s = min_splits; s <= max_splits; ++s) {
    const double time = double((items * s + slots - 1) / slots) * (work / s + overhead);
    if (time < best_time * (1 - 1e-9)) best = s, best_time = time;
  }
  return best;
}

// Block chunk of the indexer's spans for `slots` CTAs at once: items of c blocks (a span's last
// one shorter), time ~ waves * (c + 1) (a block's worth of prologue per item), the largest chunk on
// ties. c >= total / (4 slots), so that the items stay within spans + 4 slots (graph mode's bound).
int indexer_chunk(const std::vector<int>& span_blocks, int64_t slots, int max_chunk) {
  int64_t total = 0;
  for (int b : span_blocks) total += b;
  const int min_chunk = std::clamp(ceil_div(total, 4 * slots), 1, max_chunk);
  int best = max_chunk;
  double best_time = 1e300;
  for (int c = max_chunk; c >= min_chunk; --c) {
    int64_t items = 0;
    for (int b : span_blocks) items += (b + c - 1) / c;
    const double time = double((items + slots - 1) / slots) * (c + 1);
    if (time < best_time * (1 - 1e-9)) best = c, best_time = time;
  }
  return best;
}

}  // namespace

MsaSchedule build_msa_schedule(const MsaConfig& cfg, const StepBatch& host, const MsaSlots& slots,
                               int graph_pages_per_seq) {
  const IndexerParams& ip = cfg.indexer;
  const int T = host.num_tokens(), S = host.num_seqs();
  const int bs = cfg.block_size, hkv = cfg.num_kv_heads;
  M3_CHECK(static_cast<int>(host.positions.size()) == T && static_cast<int>(host.token_seq.size()) == T &&
               static_cast<int>(host.query_start.size()) == S + 1,
           "MSA plan: step arrays disagree (T={}, positions {}, token_seq {}, query_start {} for {} seqs)",
           T, host.positions.size(), host.token_seq.size(), host.query_start.size(), S);
  MsaSchedule sc;
  std::vector<int32_t>& score_offset = sc.score_offset;
  score_offset.assign(T, 0);
  std::vector<IndexerWork>& indexer = sc.indexer;
  std::vector<SparseWork>& sparse_groups = sc.sparse_groups;
  std::vector<SparseWork>& sparse_rows = sc.sparse_rows;
  std::vector<CombineWork>& sparse_combine = sc.sparse_combine;
  std::vector<CombineWork>& dense_combine = sc.dense_combine;
  std::vector<DenseWork>& dense_work = sc.dense;
  int64_t score_entries = 0;
  int max_candidates = 1;
  for (int t = 0; t < T; ++t) {
    const int pos = host.positions[t];
    score_offset[t] = static_cast<int32_t>(score_entries);
    const int n = pos >= 0 ? pos / bs + 1 : 0;
    score_entries += n;
    max_candidates = std::max(max_candidates, n);
  }
  sc.score_entries = score_entries;
  sc.max_candidates = max_candidates;
  M3_CHECK(score_entries * std::max(1, ip.index_heads) < (int64_t(1) << 31),
           "MSA plan: {} score entries exceed the int32 offsets", score_entries);

  // Graph mode: upper bounds of the context-dependent lists for (T, S, P), from the chunking rules
  // below. A list of items over spans with chunk c = clamp(ceil(total / n), lo, hi) has at most
  // spans + total / c items, and total / c <= min(total, max(n, total / hi)) for every clamp case.
  const int graph_pages = graph_pages_per_seq;
  const bool graph = graph_pages > 0;
  int max_rows_per_seq = 1;
  for (int s = 0; s < S; ++s)
    max_rows_per_seq = std::max(max_rows_per_seq, host.query_start[s + 1] - host.query_start[s]);
  const int64_t bound_blocks = int64_t(T) * graph_pages;  // spans <= T, blocks per span <= P
  const int indexer_cap = sc.indexer_cap =
      graph ? T + static_cast<int>(std::min<int64_t>(
                      bound_blocks, std::max<int64_t>(4 * slots.indexer, ceil_div(bound_blocks, detail::kIndexerMaxBlocks))))
            : 0;
  const int dense_cap = sc.dense_cap =
      graph ? T * hkv + std::max<int>(3 * slots.sms, ceil_div(bound_blocks * hkv, detail::kDenseMaxBlocks)) : 0;
  const int dense_combine_cap = sc.dense_combine_cap = graph ? T * hkv : 0;
  const int64_t dense_partial_cap = int64_t(dense_cap) * std::min(4, max_rows_per_seq);
  int& sparse_groups_cap = sc.sparse_groups_cap;  // set with the sparse schedule
  int& sparse_rows_cap = sc.sparse_rows_cap;
  int& sparse_combine_cap = sc.sparse_combine_cap;
  int64_t sparse_partial_cap = 0;
  if (graph)
    M3_CHECK(max_candidates <= graph_pages, "MSA plan (graph mode): a token sees {} blocks, the bucket has {}",
             max_candidates, graph_pages);

  if (cfg.index_dim > 0) {
    // Indexer: row tiles of <= 64 MMA rows, each against the blocks its rows may need scored.
    const int rows_per_item = detail::kIndexerRows / ip.index_heads;
    struct Span { int seq, row, count, blocks; };
    std::vector<Span> spans;
    for (int s = 0; s < S; ++s) {
      for (int r = host.query_start[s]; r < host.query_start[s + 1]; r += rows_per_item) {
        const int count = std::min(rows_per_item, host.query_start[s + 1] - r);
        const int last_pos = host.positions[r + count - 1];
        if (last_pos < 0) continue;
        const int local = last_pos / bs;
        if (local + 1 <= ip.topk_blocks) continue;  // every row keeps all its blocks
        const int blocks = ip.local_blocks >= 1 ? local - ip.local_blocks + 1 : local + 1;
        if (blocks <= 0) continue;
        spans.push_back({s, r, count, blocks});
      }
    }
    std::vector<int> span_blocks;
    for (const Span& sp : spans) span_blocks.push_back(sp.blocks);
    const int chunk = indexer_chunk(span_blocks, slots.indexer, detail::kIndexerMaxBlocks);
    for (const Span& sp : spans)
      for (int b = 0; b < sp.blocks; b += chunk)
        indexer.push_back({sp.seq, sp.row, sp.count, b, std::min(sp.blocks, b + chunk), {0, 0, 0}});

    // Sparse attention. The rows of a sequence of more than kSparseRowsAlone (a prefill chunk) go
    // in groups of 2-4 (one CTA reads a block the group's rows share once), each group's union of
    // selected blocks split into parts; the rows of shorter sequences (decode, draft tokens) go
    // alone, their slot ranges split: on NVFP4 caches they take the wgmma kernel, whose per-row
    // walk beats a group's when rows share few blocks (msa_bench, random selections), and whose
    // re-reads of blocks that rows do share mostly come from L2. Both split while the grid is
    // small. Batch-invariant mode keeps every row alone with the fewest slot splits: a group's
    // union, and a row's split count, would depend on the other rows of the step.
    const int topk = ip.topk_blocks;
    // Groups of 3-4 rows (rows x topk candidates <= kMaxGroupCandidates): splitting q >= 9 rows
    // into ceil(q / 3) or ceil(q / 4) near-equal groups leaves none of one row (which the kernel
    // would take for a row alone). With topk > 85 rows always go alone.
    const int fit = std::min(detail::kSparseGroupRows, detail::kMaxGroupCandidates / topk);
    const int group_rows = cfg.batch_invariant || fit < 3 ? 1 : fit;
    auto alone = [&](int q) { return q <= detail::kSparseRowsAlone || group_rows == 1; };
    int singles = 0, groups = 0;
    for (int s = 0; s < S; ++s) {
      const int q = host.query_start[s + 1] - host.query_start[s];
      if (alone(q)) singles += q;
      else groups += ceil_div(q, group_rows);
    }
    // Graph mode: the counts' bounds for (T, S): singles <= T, and a sequence of q >= 2 rows
    // makes at most q - 1 groups, so groups <= T - S.
    if (graph) {
      singles = T;
      groups = group_rows == 1 ? 0 : T - S;
    }
    // Work in tiles of 64 keys (a row's topk blocks); a CTA's prologue (its tile list, the query
    // tile, the pipeline's fill) costs about 4 tiles, a group's (the sort of its candidates)
    // about 10.
    const double row_tiles = double(topk) * (bs / detail::kTileTokens);
    // A row alone walks at most kMaxSlotsPerItem slots (its kernels' tile lists).
    const int min_splits = ceil_div(topk, detail::kMaxSlotsPerItem);
    // Up to 8 splits; up to 16 while the CTAs take at most half the SMs. On an H100 (132 SMs, 4
    // KV heads) 16 splits took batch 1's sparse rows (64 CTAs of one block each) from 18.3 to
    // 15.0 us on the layer's chain, a 0.5% faster step; at batch 2 (128 CTAs) the step was 1-2%
    // slower than with 8, and 12 at batch 8 (384 CTAs, three an SM) 3 us a layer slower
    // (docs/msa-kernels-notes.md "Decode splits").
    const int64_t single_items = int64_t(singles) * hkv;
    const int max_splits = std::min(topk, single_items * 16 <= slots.sms / 2 ? 16 : 8);
    const int splits = cfg.batch_invariant
                           ? min_splits
                           : wave_splits(single_items, slots.sparse_rows, min_splits, max_splits, row_tiles, 4);
    const int parts = wave_splits(int64_t(groups) * hkv, slots.sparse_groups, 1,
                                  std::min(16, std::max(1, group_rows * topk / 4)), group_rows * row_tiles, 10);
    int next_partial = 0;
    for (int s = 0; s < S; ++s) {
      const int r0 = host.query_start[s], q = host.query_start[s + 1] - r0;
      if (alone(q)) continue;
      const int n = ceil_div(q, group_rows);
      for (int k = 0; k < n; ++k) {  // near-equal groups: q = 10 -> 3 + 2 + 3 + 2 (of 3)
        const int row = r0 + int(int64_t(q) * k / n), count = r0 + int(int64_t(q) * (k + 1) / n) - row;
        for (int g = 0; g < hkv; ++g) {
          if (parts == 1) {
            sparse_groups.push_back({row, count, g, 0, 1, -1, 0, -1});
            continue;
          }
          for (int j = 0; j < parts; ++j)
            sparse_groups.push_back({row, count, g, j, parts, next_partial + j, parts, -1});
          for (int r = 0; r < count; ++r) sparse_combine.push_back({row + r, g, next_partial + r * parts, parts});
          next_partial += count * parts;
        }
      }
    }
    // The groups' merges come first in sparse_combine; a row alone's splits name theirs
    // (SparseWork::combine), which the sparse rows kernel runs itself on NVFP4 caches.
    sc.sparse_group_combines = static_cast<int>(sparse_combine.size());
    for (int s = 0; s < S; ++s) {
      const int r0 = host.query_start[s], q = host.query_start[s + 1] - r0;
      if (!alone(q)) continue;
      for (int t = r0; t < r0 + q; ++t)
        for (int g = 0; g < hkv; ++g) {
          if (splits == 1) {
            sparse_rows.push_back({t, 1, g, 0, topk, -1, 0, -1});
            continue;
          }
          const int combine = static_cast<int>(sparse_combine.size());
          // Near-equal ranges (16 slots in 7 splits: 2 or 3 each). Ranges of ceil(topk / splits)
          // left the last splits empty (16 in 5: 4, 4, 4, 4, 0; in 7: six of 3 and one past the
          // end), CTAs that read nothing while their rows' work went in fewer, longer pieces.
          for (int j = 0; j < splits; ++j)
            sparse_rows.push_back({t, 1, g, topk * j / splits, topk * (j + 1) / splits, next_partial + j, 1, combine});
          sparse_combine.push_back({t, g, next_partial, splits});
          next_partial += splits;
        }
    }
    if (graph) {
      sparse_rows_cap = singles * hkv * splits;
      sparse_groups_cap = groups * hkv * parts;
      sparse_combine_cap = (splits > 1 || parts > 1) ? T * hkv : 0;
      // Rows in groups: at most T, none where the step has no groups' bound (every sequence one row).
      sc.sparse_group_combine_cap = parts > 1 && groups > 0 ? T * hkv : 0;
      sparse_partial_cap = int64_t(T) * hkv * std::max(splits, parts);
    }
    const int64_t sparse_partials = std::max<int64_t>(next_partial, sparse_partial_cap);
    sc.sparse_splits = splits;
    sc.sparse_parts = parts;
    sc.sparse_partials = sparse_partials;
    sc.score_capacity = graph ? std::max(score_entries, bound_blocks) : score_entries;
  }

  if (cfg.dense) {
    // Batch-invariant mode: chunks of kDenseMaxBlocks blocks whatever the step, and a group of
    // rows (which shares its chunk boundaries and its pieces' combine) ends where the next row
    // would need another number of pieces, so that a row's split is a function of its own
    // position: inside a piece a row walks only the tiles up to its position, in order.
    const bool fixed = cfg.batch_invariant;
    auto pieces_at = [&](int pos) { return pos < 0 ? 0 : ceil_div(pos / bs + 1, detail::kDenseMaxBlocks); };
    struct Group { int seq, row, count, blocks; };
    std::vector<Group> groups;
    int64_t total_blocks = 0;
    for (int s = 0; s < S; ++s)
      for (int r = host.query_start[s], count = 0; r < host.query_start[s + 1]; r += count) {
        count = std::min(4, host.query_start[s + 1] - r);
        if (fixed) {
          int same = 1;
          while (same < count && pieces_at(host.positions[r + same]) == pieces_at(host.positions[r])) ++same;
          count = same;
        }
        const int last_pos = host.positions[r + count - 1];
        if (last_pos < 0) continue;
        groups.push_back({s, r, count, last_pos / bs + 1});
        total_blocks += int64_t(last_pos / bs + 1) * hkv;
      }
    const int chunk = fixed ? detail::kDenseMaxBlocks
                            : std::clamp(ceil_div(total_blocks, 3 * int64_t(slots.sms)), 8, detail::kDenseMaxBlocks);
    int next_partial = 0;
    for (const Group& gr : groups)
      for (int g = 0; g < hkv; ++g) {
        const int pieces = ceil_div(gr.blocks, chunk);
        if (pieces == 1) {
          dense_work.push_back({gr.seq, gr.row, gr.count, g, 0, gr.blocks, -1, 0});
          continue;
        }
        for (int j = 0; j < pieces; ++j)
          dense_work.push_back({gr.seq, gr.row, gr.count, g, j * chunk, std::min(gr.blocks, (j + 1) * chunk),
                                next_partial + j, pieces});
        for (int r = 0; r < gr.count; ++r) dense_combine.push_back({gr.row + r, g, next_partial + r * pieces, pieces});
        next_partial += gr.count * pieces;
      }
    sc.dense_partials = graph ? std::max<int64_t>(next_partial, dense_partial_cap) : next_partial;
  }
  if (graph)
    M3_CHECK(int(indexer.size()) <= indexer_cap && int(dense_work.size()) <= dense_cap &&
                 int(dense_combine.size()) <= dense_combine_cap && int(sparse_groups.size()) <= sparse_groups_cap &&
                 int(sparse_rows.size()) <= sparse_rows_cap && int(sparse_combine.size()) <= sparse_combine_cap &&
                 sc.sparse_group_combines <= sc.sparse_group_combine_cap,
             "MSA plan (graph mode): {} indexer / {} dense / {} combine / {} sparse group / {} sparse row / {} sparse "
             "combine ({} of groups) items exceed the bounds {} / {} / {} / {} / {} / {} ({})",
             indexer.size(), dense_work.size(), dense_combine.size(), sparse_groups.size(), sparse_rows.size(),
             sparse_combine.size(), sc.sparse_group_combines, indexer_cap, dense_cap, dense_combine_cap,
             sparse_groups_cap, sparse_rows_cap, sparse_combine_cap, sc.sparse_group_combine_cap);

  return sc;
}

}  // namespace m3::cuda
