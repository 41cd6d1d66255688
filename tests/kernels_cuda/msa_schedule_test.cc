// The MSA kernels' work lists (kernels/cuda/msa_schedule) on random steps, without a GPU: every
// scored block of every row tile once, every (row, KV head) of sparse and dense attention covered
// exactly once by its pieces, every split's partials merged by exactly one combine item and never
// written twice, the routing of rows alone and in groups, batch-invariant splits, graph-mode caps.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "kernels/cuda/msa_schedule.h"

namespace m3::cuda {
namespace {

using detail::CombineWork;
using detail::DenseWork;
using detail::IndexerWork;
using detail::SparseWork;

struct Seq {
  int q_len, seq_len;
};

StepBatch make_step(const std::vector<Seq>& seqs) {
  StepBatch b;
  b.query_start.push_back(0);
  for (int s = 0; s < int(seqs.size()); ++s) {
    for (int i = 0; i < seqs[s].q_len; ++i) {
      b.token_ids.push_back(1);
      b.positions.push_back(seqs[s].seq_len - seqs[s].q_len + i);
      b.token_seq.push_back(s);
    }
    b.query_start.push_back(b.query_start.back() + seqs[s].q_len);
    b.seq_lens.push_back(seqs[s].seq_len);
  }
  return b;
}

MsaConfig config(int q_heads, int kv_heads, int block, int topk, int index_heads, bool batch_invariant) {
  MsaConfig c;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.block_size = block;
  c.indexer = {index_heads, topk, 1, 0};
  c.dense = true;
  c.batch_invariant = batch_invariant;
  return c;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The end of the half-open ranges, once sorted, when they tile [0, end) without gap or overlap;
// -1 (and a failure naming `what`) when they do not.
int tiled_end(std::vector<std::pair<int, int>> ranges, const std::string& what) {
  std::sort(ranges.begin(), ranges.end());
  int next = 0;
  for (auto [lo, hi] : ranges) {
    EXPECT_EQ(lo, next) << what << ": a gap or an overlap";
    if (lo != next) return -1;
    next = hi;
  }
  return next;
}

// Partial results written by the pieces of (row, KV head), and the combine items, checked
// against each other: each (row, head) split in n > 1 pieces has one combine item whose n
// partials are exactly those its pieces write; no partial index is written twice.
class PartialLedger {
 public:
  void write(int row, int head, int partial) {
    EXPECT_TRUE(written_.insert(partial).second) << "partial " << partial << " written twice";
    by_key_[{row, head}].insert(partial);
  }
  void check(const std::vector<CombineWork>& combine, int64_t reserved) const {
    std::set<std::pair<int, int>> merged;
    for (const CombineWork& c : combine) {
      ASSERT_TRUE(merged.insert({c.row, c.kv_head}).second) << "row " << c.row << " head " << c.kv_head << " merged twice";
      std::set<int> want;
      for (int i = 0; i < c.num_splits; ++i) want.insert(c.partial_begin + i);
      auto it = by_key_.find({c.row, c.kv_head});
      ASSERT_NE(it, by_key_.end()) << "a merge of row " << c.row << " without pieces";
      EXPECT_EQ(it->second, want) << "row " << c.row << " head " << c.kv_head;
    }
    for (const auto& [key, parts] : by_key_)
      EXPECT_TRUE(merged.count(key)) << "row " << key.first << " head " << key.second << " split but never merged";
    for (int p : written_) EXPECT_LT(p, reserved) << "partial beyond the reserved ones";
  }

 private:
  std::set<int> written_;
  std::map<std::pair<int, int>, std::set<int>> by_key_;
};

void check_schedule(const MsaConfig& cfg, const StepBatch& b, const MsaSchedule& sc, int graph_pages) {
  const int T = b.num_tokens(), S = b.num_seqs(), bs = cfg.block_size, hkv = cfg.num_kv_heads;
  const int topk = cfg.indexer.topk_blocks, heads = cfg.indexer.index_heads;

  // Indexer: per row tile of a sequence, the scored blocks [0, blocks) once, in chunks.
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> tiles;  // (seq, first row) -> ranges
  for (const IndexerWork& w : sc.indexer) {
    ASSERT_GE(w.seq, 0);
    ASSERT_LT(w.seq, S);
    EXPECT_GE(w.row_begin, b.query_start[w.seq]);
    EXPECT_LE(w.row_begin + w.row_count, b.query_start[w.seq + 1]);
    EXPECT_LE(w.row_count * heads, detail::kIndexerRows);
    EXPECT_LE(w.block_end - w.block_begin, detail::kIndexerMaxBlocks);
    EXPECT_LT(w.block_begin, w.block_end);
    tiles[{w.seq, w.row_begin}].push_back({w.block_begin, w.block_end});
  }
  const int rows_per_item = detail::kIndexerRows / heads;
  for (int s = 0; s < S; ++s)
    for (int r = b.query_start[s]; r < b.query_start[s + 1]; r += rows_per_item) {
      const int count = std::min(rows_per_item, b.query_start[s + 1] - r);
      const int local = b.positions[r + count - 1] / bs;
      const int want = local + 1 <= topk ? 0 : local;  // one forced local block
      const std::string what = "indexer, seq " + std::to_string(s) + " row " + std::to_string(r);
      EXPECT_EQ(tiled_end(tiles[{s, r}], what), want) << what << ": blocks scored";
    }

  // Sparse attention: rows of sequences of <= kSparseRowsAlone rows (every row in batch-invariant
  // mode, or where fewer than 3 rows' selections fit a group) alone, their slots [0, topk) in
  // ranges of <= kMaxSlotsPerItem; longer sequences in groups of 2-4 rows, each group's parts
  // 0..n-1 once.
  PartialLedger sparse;
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> slots;  // (row, head) -> ranges
  // A split row names its merge (SparseWork::combine, run by the sparse rows kernel's last CTA):
  // past the groups' merges, of its own (row, head), over a range holding its partial.
  for (const SparseWork& w : sc.sparse_rows) {
    ASSERT_EQ(w.row_count, 1);
    EXPECT_LT(w.begin, w.end) << "row " << w.row << ": an empty split";
    EXPECT_LE(w.end - w.begin, detail::kMaxSlotsPerItem);
    slots[{w.row, w.kv_head}].push_back({w.begin, w.end});
    if (w.partial >= 0) sparse.write(w.row, w.kv_head, w.partial);
    EXPECT_EQ(w.combine >= 0, w.partial >= 0) << "row " << w.row << ": a partial needs its merge";
    if (w.combine >= 0) {
      ASSERT_LT(w.combine, int(sc.sparse_combine.size()));
      EXPECT_GE(w.combine, sc.sparse_group_combines) << "a row alone named a group's merge";
      const CombineWork& c = sc.sparse_combine[w.combine];
      EXPECT_EQ(c.row, w.row);
      EXPECT_EQ(c.kv_head, w.kv_head);
      EXPECT_GE(w.partial, c.partial_begin);
      EXPECT_LT(w.partial, c.partial_begin + c.num_splits);
    }
  }
  for (int i = 0; i < int(sc.sparse_combine.size()); ++i) {
    const bool of_group = i < sc.sparse_group_combines;
    const bool row_grouped = std::any_of(sc.sparse_groups.begin(), sc.sparse_groups.end(), [&](const SparseWork& w) {
      const CombineWork& c = sc.sparse_combine[i];
      return w.kv_head == c.kv_head && c.row >= w.row && c.row < w.row + w.row_count;
    });
    EXPECT_EQ(of_group, row_grouped) << "sparse merge " << i << ": groups' merges first, rows alone's after";
  }
  std::map<std::tuple<int, int, int>, std::set<int>> parts;  // (first row, count, head) -> parts seen
  std::map<std::pair<int, int>, int> grouped;                 // (row, head) -> its group's first row
  for (const SparseWork& w : sc.sparse_groups) {
    EXPECT_EQ(w.combine, -1) << "a group's merges run in the combine launch";
    ASSERT_GE(w.row_count, 2);
    ASSERT_LE(w.row_count, detail::kSparseGroupRows);
    EXPECT_EQ(b.token_seq[w.row], b.token_seq[w.row + w.row_count - 1]) << "a group across sequences";
    const std::tuple<int, int, int> key{w.row, w.row_count, w.kv_head};
    EXPECT_TRUE(parts[key].insert(w.begin).second);
    EXPECT_LT(w.begin, w.end);
    for (int r = 0; r < w.row_count; ++r) {
      auto [it, fresh] = grouped.insert({{w.row + r, w.kv_head}, w.row});
      EXPECT_EQ(it->second, w.row) << "row " << w.row + r << " in two groups";
      if (w.partial >= 0) sparse.write(w.row + r, w.kv_head, w.partial + r * w.partial_stride);
    }
  }
  for (const auto& [key, seen] : parts) EXPECT_EQ(int(seen.size()), sc.sparse_parts);
  for (int s = 0; s < S; ++s) {
    const int q = b.query_start[s + 1] - b.query_start[s];
    const bool alone = cfg.batch_invariant || q <= detail::kSparseRowsAlone || detail::kMaxGroupCandidates / topk < 3;
    for (int t = b.query_start[s]; t < b.query_start[s + 1]; ++t)
      for (int g = 0; g < hkv; ++g) {
        if (!alone) {
          EXPECT_TRUE(grouped.count({t, g})) << "row " << t << " of a " << q << "-row sequence not grouped";
          EXPECT_FALSE(slots.count({t, g}));
          continue;
        }
        EXPECT_FALSE(grouped.count({t, g}));
        const std::string what = "sparse row " + std::to_string(t) + " head " + std::to_string(g);
        EXPECT_EQ(tiled_end(slots[{t, g}], what), topk) << what << ": slots covered";
        if (cfg.batch_invariant) {
          EXPECT_EQ(int(slots[{t, g}].size()), ceil_div(topk, detail::kMaxSlotsPerItem));
        }
      }
  }
  sparse.check(sc.sparse_combine, sc.sparse_partials);

  // Dense attention: per (row, head) the pieces of its group partition [0, blocks of the group's
  // last row), groups of <= 4 rows of one sequence.
  PartialLedger dense;
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> pieces;
  for (const DenseWork& w : sc.dense) {
    ASSERT_GE(w.row_count, 1);
    ASSERT_LE(w.row_count, 4);
    EXPECT_EQ(b.token_seq[w.row_begin], w.seq);
    EXPECT_EQ(b.token_seq[w.row_begin + w.row_count - 1], w.seq);
    EXPECT_LE(w.block_end - w.block_begin, detail::kDenseMaxBlocks);
    for (int r = 0; r < w.row_count; ++r) {
      pieces[{w.row_begin + r, w.kv_head}].push_back({w.block_begin, w.block_end});
      if (w.partial >= 0) dense.write(w.row_begin + r, w.kv_head, w.partial + r * w.partial_stride);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < hkv; ++g) {
      const std::string what = "dense row " + std::to_string(t) + " head " + std::to_string(g);
      EXPECT_GE(tiled_end(pieces[{t, g}], what), b.positions[t] / bs + 1) << what << ": its blocks covered";
    }
  dense.check(sc.dense_combine, sc.dense_partials);

  if (graph_pages > 0) {
    EXPECT_LE(int(sc.indexer.size()), sc.indexer_cap);
    EXPECT_LE(int(sc.sparse_rows.size()), sc.sparse_rows_cap);
    EXPECT_LE(int(sc.sparse_groups.size()), sc.sparse_groups_cap);
    EXPECT_LE(int(sc.sparse_combine.size()), sc.sparse_combine_cap);
    EXPECT_LE(sc.sparse_group_combines, sc.sparse_group_combine_cap);
    EXPECT_LE(int(sc.dense.size()), sc.dense_cap);
    EXPECT_LE(int(sc.dense_combine.size()), sc.dense_combine_cap);
  }
}

std::vector<Seq> random_seqs(std::mt19937& rng, int max_seqs, int max_q, int max_len) {
  std::uniform_int_distribution<int> n(1, max_seqs), q(1, max_q), len(1, max_len);
  std::vector<Seq> seqs(n(rng));
  for (Seq& s : seqs) {
    s.q_len = q(rng);
    s.seq_len = std::max(s.q_len, len(rng));
  }
  return seqs;
}

TEST(MsaSchedule, RandomStepsKeepEveryInvariant) {
  std::mt19937 rng(7);
  const MsaSlots slots{132, 660, 528, 396};
  for (int round = 0; round < 300; ++round) {
    const int block = std::vector<int>{64, 128, 256}[round % 3];
    const int topk = std::vector<int>{16, 4, 64, 128}[round % 4];
    const int kv_heads = round % 5 == 0 ? 4 : 1;
    const int index_heads = std::vector<int>{1, 4, 2}[round % 3];
    const bool invariant = round % 7 == 3;
    const MsaConfig cfg = config(16 * kv_heads, kv_heads, block, topk, index_heads, invariant);
    const std::vector<Seq> seqs = random_seqs(rng, 12, round % 2 ? 40 : 9, round % 3 ? 70000 : 5000);
    const StepBatch b = make_step(seqs);
    SCOPED_TRACE(::testing::Message() << "round " << round << " block " << block << " topk " << topk << " hkv "
                                      << kv_heads << " index heads " << index_heads << " invariant " << invariant);
    check_schedule(cfg, b, build_msa_schedule(cfg, b, slots, 0), 0);
    if (HasFatalFailure()) return;
  }
}

TEST(MsaSchedule, EverySplitCountOfDecodeRowsTilesTheirSlots) {
  // Decode steps of 1-160 rows at several CTA counts reach every split count the wave rule can
  // pick; a row's splits tile its topk slots whatever the count (16 slots in 7 splits of
  // ceil(16 / 7) = 3 would leave a seventh split beyond the last slot).
  for (const int topk : {16, 4, 48, 33, 64}) {
    const MsaConfig cfg = config(64, 4, 128, topk, 4, false);
    for (const int slots_rows : {132, 264, 396, 528}) {
      std::set<int> counts;
      for (int rows = 1; rows <= 160; ++rows) {
        const StepBatch b = make_step(std::vector<Seq>(rows, Seq{1, 9000}));
        const MsaSchedule sc = build_msa_schedule(cfg, b, MsaSlots{132, 660, slots_rows, 396}, 0);
        SCOPED_TRACE(::testing::Message() << "topk " << topk << " CTAs " << slots_rows << " rows " << rows);
        check_schedule(cfg, b, sc, 0);
        if (HasFatalFailure()) return;
        counts.insert(sc.sparse_splits);
      }
      EXPECT_GE(int(counts.size()), std::min(topk, 3)) << "topk " << topk << ": few split counts reached";
    }
  }
}

TEST(MsaSchedule, DecodeAndDraftRowsGoAloneAndPrefillChunksInGroups) {
  const MsaConfig cfg = config(64, 4, 128, 16, 4, false);
  const MsaSlots slots{132, 660, 528, 396};
  const StepBatch b = make_step({{1, 9000}, {8, 40000}, {9, 30000}, {200, 3000}});
  const MsaSchedule sc = build_msa_schedule(cfg, b, slots, 0);
  check_schedule(cfg, b, sc, 0);
  std::set<int> alone, grouped;
  for (const SparseWork& w : sc.sparse_rows) alone.insert(w.row);
  for (const SparseWork& w : sc.sparse_groups)
    for (int r = 0; r < w.row_count; ++r) grouped.insert(w.row + r);
  EXPECT_EQ(int(alone.size()), 1 + 8);    // the decode row and the 8 draft rows
  EXPECT_EQ(int(grouped.size()), 9 + 200);  // the chunks of 9 and 200 rows
}

TEST(MsaSchedule, GraphModeStaysWithinItsCapsForEveryDecodeStepOfItsShape) {
  // The caps depend on (tokens, sequences, pages) only: every decode step of 64 sequences whose
  // contexts fit 2048 pages of 128 tokens must fit them.
  const MsaConfig cfg = config(64, 4, 128, 16, 4, false);
  const MsaSlots slots{132, 660, 528, 396};
  std::mt19937 rng(11);
  int caps[6] = {-1, -1, -1, -1, -1, -1};
  for (int round = 0; round < 40; ++round) {
    std::uniform_int_distribution<int> len(1, 2048 * 128);
    std::vector<Seq> seqs(64);
    for (Seq& s : seqs) s = {1, round % 4 == 0 ? 2048 * 128 : len(rng)};
    const StepBatch b = make_step(seqs);
    const MsaSchedule sc = build_msa_schedule(cfg, b, slots, 2048);
    check_schedule(cfg, b, sc, 2048);
    const int now[6] = {sc.indexer_cap, sc.sparse_rows_cap, sc.sparse_groups_cap, sc.sparse_combine_cap, sc.dense_cap,
                        sc.dense_combine_cap};
    for (int i = 0; i < 6; ++i) {
      if (caps[i] >= 0) {
        EXPECT_EQ(now[i], caps[i]) << "cap " << i << " moved with the contexts";
      }
      caps[i] = now[i];
    }
  }
}

TEST(MsaSchedule, WorkListsFillWholeWaves) {
  // 64 decode rows x 4 KV heads at 396 row-kernel CTAs at once: three splits (768 CTAs, two
  // waves of work a third the size) beat one (256 CTAs, a partial wave) and two (512: two waves).
  const MsaConfig cfg = config(64, 4, 128, 16, 4, false);
  std::vector<Seq> seqs(64, Seq{1, 131072});
  const StepBatch b = make_step(seqs);
  const MsaSchedule sc = build_msa_schedule(cfg, b, MsaSlots{132, 660, 396, 396}, 0);
  EXPECT_EQ(sc.sparse_splits, 3);
  EXPECT_EQ(int(sc.sparse_rows.size()), 64 * 4 * 3);
  // The indexer's items stay within spans + 4 waves of its CTAs.
  EXPECT_LE(int(sc.indexer.size()), 64 + 4 * 660);
}

}  // namespace
}  // namespace m3::cuda
