// Indexer decode context parallelism (ops/attention.h "Indexer DCP") on the CPU reference: the
// candidates of every cp rank, gathered by hand and merged per part, give bitwise the block ids of
// indexer_topk on one rank, for every head, on caches of every index dtype whose scores tie a lot
// (keys and queries from {-1, 0, 1}), prefill, chunk, draft and decode positions, sequences of 1
// to 38 blocks, several forcing parameters, cp 1..4 and 1, 2 or 4 parts. The same suite run with
// deliberately broken merges or candidates must fail, or it proves nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "kernels/cpu/attention.h"

namespace m3 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kBlock = 8, kIndexDim = 16, kHeadsPerPart = 2;

enum class Values { kTernary, kNormal };

// One step over a pool of shuffled blocks: every token of every sequence is in the index cache;
// the queries are each sequence's last q_len positions.
struct DcpWorld {
  KvDType index;
  std::vector<int32_t> page_table, positions, token_seq, seq_lens, slots;
  int pages_per_seq = 0;
  KvLayout layout;
  std::vector<uint8_t> pool;

  DcpWorld(KvDType index_dtype, Values values, uint32_t seed) : index(index_dtype) {
    // (seq_len, q_len): decode, drafts, whole prefills, a chunk against a long history; 1 to 38 blocks.
    const std::vector<std::pair<int, int>> seqs = {{1, 1},   {5, 5},  {8, 1},   {9, 2},
                                                   {30, 30}, {77, 3}, {300, 1}, {260, 24}};
    std::mt19937 rng(seed);
    for (const auto& [len, q] : seqs) pages_per_seq = std::max(pages_per_seq, (len + kBlock - 1) / kBlock);
    const int num_blocks = pages_per_seq * int(seqs.size()) + 2;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    page_table.assign(seqs.size() * pages_per_seq, -1);
    for (size_t s = 0, next = 0; s < seqs.size(); ++s)
      for (int p = 0; p < (seqs[s].first + kBlock - 1) / kBlock; ++p) page_table[s * pages_per_seq + p] = ids[next++];
    layout = KvLayout::make(kBlock, 1, 16, kIndexDim, KvDType::kBF16, index, {true});
    pool.assign(layout.block_bytes * num_blocks, 0xAB);
    std::vector<int32_t> all_slots;
    std::vector<float> keys;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [len, q_len] = seqs[s];
      seq_lens.push_back(len);
      for (int p = 0; p < len; ++p) {
        const int32_t slot = page_table[s * pages_per_seq + p / kBlock] * kBlock + p % kBlock;
        all_slots.push_back(slot);
        const std::vector<float> row = random_row(rng, values, kIndexDim);
        keys.insert(keys.end(), row.begin(), row.end());
        if (p >= len - q_len) {
          positions.push_back(p);
          token_seq.push_back(int32_t(s));
          slots.push_back(slot);
        }
      }
    }
    StepView fill;
    fill.num_tokens = int(all_slots.size());
    fill.slot_mapping = all_slots.data();
    const std::vector<float> kv(all_slots.size() * 16, 0.0f);
    cpu_kv_insert(fill, cache(), kv.data(), kv.data(), keys.data());
  }

  // Ternary: ties everywhere, a few all-zero rows (scores of +-0); normal: bf16 N(0, 1).
  static std::vector<float> random_row(std::mt19937& rng, Values values, int n) {
    std::vector<float> row(n);
    if (values == Values::kNormal) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : row) x = bf16_round(normal(rng));
      return row;
    }
    const int kind = int(rng() % 10);  // 0: all zero, 1: no positive entry, else {-1, 0, 1}
    for (float& x : row) x = kind == 0 ? 0.0f : float(int(rng() % (kind == 1 ? 2 : 3)) - 1);
    return row;
  }

  KvLayerView cache() { return layout.layer_view(pool.data(), 0); }
  StepView step() const {
    StepView v;
    v.num_tokens = int(positions.size());
    v.num_seqs = int(seq_lens.size());
    v.positions = positions.data();
    v.token_seq = token_seq.data();
    v.seq_lens = seq_lens.data();
    v.page_table = page_table.data();
    v.pages_per_seq = pages_per_seq;
    v.slot_mapping = slots.data();
    return v;
  }
  int tokens() const { return int(positions.size()); }
};

// The ways the pipeline can be broken, to show that the suite notices.
enum class Fault {
  kNone,
  kMergeTiesByRank,   // merge ranks equal scores in gather (rank) order, not by block id
  kMergeDropsTies,    // merge keeps one candidate per distinct score
  kCandidatesShort,   // each rank keeps one candidate fewer than k
  kCandidatesIgnoreForced,  // candidates rank forced blocks by their real score
};

// The merge of ops/attention.h written out, with the faults a merge could have.
void test_merge(const std::vector<int64_t>& gathered, int cp, int parts, int part, int tokens, int hl, int topk,
                Fault fault, int32_t* selection) {
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < hl; ++h) {
      std::vector<int64_t> keys;
      for (int r = 0; r < cp; ++r)
        for (int i = 0; i < topk; ++i) {
          const int64_t k = gathered[(((size_t(r) * parts + part) * tokens + t) * hl + h) * topk + i];
          if (k != 0) keys.push_back(k);
        }
      auto score_part = [](int64_t k) { return k >> 31; };
      if (fault == Fault::kMergeTiesByRank)
        std::stable_sort(keys.begin(), keys.end(), [&](int64_t a, int64_t b) { return score_part(a) > score_part(b); });
      else
        std::sort(keys.begin(), keys.end(), std::greater<>());
      if (fault == Fault::kMergeDropsTies)
        keys.erase(std::unique(keys.begin(), keys.end(), [&](int64_t a, int64_t b) { return score_part(a) == score_part(b); }),
                   keys.end());
      std::vector<int32_t> ids;
      for (size_t i = 0; i < keys.size() && int(i) < topk; ++i) ids.push_back(indexer_candidate_block(keys[i]));
      std::sort(ids.begin(), ids.end());
      int32_t* out = selection + (size_t(t) * hl + h) * topk;
      for (int i = 0; i < topk; ++i) out[i] = i < int(ids.size()) ? ids[i] : -1;
    }
}

struct Tally {
  int64_t rows = 0;         // (token, global head) rows compared
  int64_t mismatches = 0;   // rows whose merged ids differ from indexer_topk's
  int64_t boundary_ties = 0;  // rows whose last kept block ties with the best dropped one
  int64_t bad_candidates = 0;  // candidate rows breaking their own contract
};

// The k of ops/attention.h and the scores of the row (forced blocks at +inf), from the shared
// scoring function, for counting the rows where a tie decides the selection.
bool boundary_tie(DcpWorld& w, int t, const float* q, const IndexerParams& p) {
  const StepView v = w.step();
  const int local = v.positions[t] / kBlock, visible = local + 1;
  std::vector<float> qq(kIndexDim), key(kIndexDim), score(visible);
  for (int i = 0; i < kIndexDim; ++i) qq[i] = cpu_index_query_value(w.index, q[i]);
  const int32_t* pages = v.page_table + size_t(v.token_seq[t]) * v.pages_per_seq;
  for (int b = 0; b < visible; ++b) {
    cpu_indexer_block_scores(w.cache(), pages, v.positions[t], b, qq.data(), 1, key.data(), &score[b], 1);
    if (indexer_forced_block(b, local, p)) score[b] = kInf;
  }
  const int k = std::min(p.topk_blocks, (v.seq_lens[v.token_seq[t]] + kBlock - 1) / kBlock);
  if (k >= visible) return false;
  std::sort(score.begin(), score.end(), std::greater<>());
  return score[k - 1] == score[k] && score[k] != -kInf;
}

// Candidates contract: keys descending then zeros, at most k non-zero, each of a block of the slice.
int64_t check_candidates(const std::vector<int64_t>& cand, const StepView& v, int parts, int hl, int topk, int cp,
                         int rank) {
  int64_t bad = 0;
  for (int p = 0; p < parts; ++p)
    for (int t = 0; t < v.num_tokens; ++t)
      for (int h = 0; h < hl; ++h) {
        const int64_t* row = cand.data() + ((size_t(p) * v.num_tokens + t) * hl + h) * topk;
        const int local = v.positions[t] / kBlock;
        const int k = std::min(topk, (v.seq_lens[v.token_seq[t]] + kBlock - 1) / kBlock);
        bool ok = true;
        int nonzero = 0;
        for (int i = 0; i < topk; ++i) {
          if (row[i] == 0) continue;
          ++nonzero;
          const int b = indexer_candidate_block(row[i]);
          ok &= row[i] > 0 && b % cp == rank && b <= local && (i == 0 || row[i - 1] > row[i]);
        }
        bad += !ok || nonzero > k;
      }
  return bad;
}

// The whole suite under one fault.
Tally run_suite(Fault fault) {
  Tally tally;
  const std::vector<IndexerParams> param_sets = {
      {0, 4, 1, 0},   // the M3 forcing, a small top-k
      {0, 3, 2, 1},   // two local blocks and one initial block
      {0, 1, 0, 0},   // top-1, nothing forced
      {0, 16, 1, 2},  // more than most sequences have
  };
  uint32_t seed = 1;
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kFP8, KvDType::kNVFP4})
    for (Values values : {Values::kTernary, Values::kNormal}) {
      DcpWorld w(dtype, values, seed++);
      const StepView v = w.step();
      const int tokens = w.tokens();
      for (const IndexerParams& base : param_sets)
        for (int parts : {1, 2, 4}) {
          const int heads = parts * kHeadsPerPart, topk = base.topk_blocks;
          std::mt19937 rng(seed++);
          std::vector<float> q_all;  // [T, heads * Di]
          for (int i = 0; i < tokens * heads; ++i) {
            const std::vector<float> row = DcpWorld::random_row(rng, values, kIndexDim);
            q_all.insert(q_all.end(), row.begin(), row.end());
          }
          IndexerParams all = base, local = base;
          all.index_heads = heads;
          local.index_heads = kHeadsPerPart;
          std::vector<int32_t> want(size_t(tokens) * heads * topk);
          cpu_indexer_topk(v, w.cache(), q_all.data(), all, want.data());
          // The all-gather of every rank's [T, Hl * Di] queries: part p = heads p*Hl .. p*Hl+Hl-1.
          const int cols = kHeadsPerPart * kIndexDim;
          std::vector<float> q_parts(size_t(parts) * tokens * cols);
          for (int p = 0; p < parts; ++p)
            for (int t = 0; t < tokens; ++t)
              std::copy_n(q_all.begin() + (size_t(t) * heads + p * kHeadsPerPart) * kIndexDim, cols,
                          q_parts.begin() + (size_t(p) * tokens + t) * cols);
          if (fault == Fault::kNone)
            for (int t = 0; t < tokens; ++t)
              for (int g = 0; g < heads; ++g)
                tally.boundary_ties += boundary_tie(w, t, q_all.data() + (size_t(t) * heads + g) * kIndexDim, all);
          for (int cp = 1; cp <= 4; ++cp) {
            const size_t per_rank = size_t(parts) * tokens * kHeadsPerPart * topk;
            std::vector<int64_t> gathered(cp * per_rank);
            for (int r = 0; r < cp; ++r) {
              IndexerParams cand_params = local;
              if (fault == Fault::kCandidatesIgnoreForced) cand_params.local_blocks = cand_params.init_blocks = 0;
              std::vector<int64_t> cand(per_rank, 0x5a5a5a5a5a5a5a5a);  // every slot must be written
              cpu_indexer_topk_candidates(v, w.cache(), q_parts.data(), parts, cand_params, cp, r, cand.data());
              if (fault == Fault::kNone) tally.bad_candidates += check_candidates(cand, v, parts, kHeadsPerPart, topk, cp, r);
              if (fault == Fault::kCandidatesShort)
                for (size_t row = 0; row < per_rank; row += topk) {
                  int n = 0;
                  while (n < topk && cand[row + n] != 0) ++n;
                  if (n > 0) cand[row + n - 1] = 0;
                }
              std::copy(cand.begin(), cand.end(), gathered.begin() + r * per_rank);
            }
            for (int part = 0; part < parts; ++part) {
              std::vector<int32_t> got(size_t(tokens) * kHeadsPerPart * topk, 0x7f7f7f7f);
              const bool ours = fault == Fault::kNone || fault == Fault::kCandidatesShort ||
                                fault == Fault::kCandidatesIgnoreForced;
              if (ours)
                cpu_merge_topk_candidates(v, gathered.data(), cp, parts, part, local, got.data());
              else
                test_merge(gathered, cp, parts, part, tokens, kHeadsPerPart, topk, fault, got.data());
              for (int t = 0; t < tokens; ++t)
                for (int h = 0; h < kHeadsPerPart; ++h) {
                  const int32_t* g = got.data() + (size_t(t) * kHeadsPerPart + h) * topk;
                  std::vector<int32_t> r(want.begin() + (size_t(t) * heads + part * kHeadsPerPart + h) * topk,
                                         want.begin() + (size_t(t) * heads + part * kHeadsPerPart + h + 1) * topk);
                  // indexer_topk lists by score: its set, ascending, valid ids first, is the merge's contract.
                  std::sort(r.begin(), r.end(), [](int32_t a, int32_t b) {
                    return (a < 0 ? std::numeric_limits<int32_t>::max() : a) <
                           (b < 0 ? std::numeric_limits<int32_t>::max() : b);
                  });
                  ++tally.rows;
                  tally.mismatches += !std::equal(r.begin(), r.end(), g);
                }
            }
          }
        }
    }
  return tally;
}

TEST(IndexerDcp, MergedCandidatesEqualIndexerTopkOnEveryRankSplit) {
  const Tally t = run_suite(Fault::kNone);
  // 4 dtypes x 2 value sets x 4 parameter sets x (1 + 2 + 4 parts) x 2 heads x 67 tokens x 4 cp sizes.
  EXPECT_EQ(t.rows, int64_t(4 * 2 * 4 * 7 * kHeadsPerPart) * 67 * 4);
  EXPECT_EQ(t.mismatches, 0);
  EXPECT_EQ(t.bad_candidates, 0);
  // The suite is about ties: many rows must have the selection decided by one.
  EXPECT_GT(t.boundary_ties, 1000) << "too few score ties at the top-k boundary to test tie handling";
  std::printf("indexer DCP: %lld rows compared, %lld (token, head) rows with a tie at the top-k boundary\n",
              static_cast<long long>(t.rows), static_cast<long long>(t.boundary_ties));
}

// The suite has teeth: each broken variant makes it fail.
TEST(IndexerDcp, SuiteCatchesBrokenPipelines) {
  for (Fault f : {Fault::kMergeTiesByRank, Fault::kMergeDropsTies, Fault::kCandidatesShort,
                  Fault::kCandidatesIgnoreForced})
    EXPECT_GT(run_suite(f).mismatches, 0) << "fault " << int(f) << " went unnoticed";
}

// The key is an order-preserving image of (score descending, block ascending).
TEST(IndexerDcp, CandidateKeyOrdersByScoreThenLowerBlock) {
  const float max = std::numeric_limits<float>::max(), denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> scores = {-max, -1e30f, -3.5f, -1.0f, -denorm, 0.0f, denorm, 1e-30f, 1.0f, 2.5f, max, kInf};
  const std::vector<int32_t> blocks = {0, 1, 2, 127, 65535, 65536, 1 << 20, std::numeric_limits<int32_t>::max()};
  for (size_t i = 0; i < scores.size(); ++i)
    for (int32_t a : blocks) {
      const int64_t ka = indexer_candidate_key(scores[i], a);
      EXPECT_GT(ka, 0);
      EXPECT_EQ(indexer_candidate_block(ka), a);
      for (size_t j = 0; j < scores.size(); ++j)
        for (int32_t b : blocks) {
          const bool a_first = scores[i] > scores[j] || (scores[i] == scores[j] && a < b);
          const bool same = scores[i] == scores[j] && a == b;
          EXPECT_EQ(ka > indexer_candidate_key(scores[j], b), a_first) << scores[i] << "/" << a << " vs " << scores[j] << "/" << b;
          EXPECT_EQ(ka == indexer_candidate_key(scores[j], b), same);
        }
    }
  // -0 equals +0 under the reference's comparison: the block id decides.
  EXPECT_EQ(indexer_candidate_key(-0.0f, 5), indexer_candidate_key(0.0f, 5));
  EXPECT_GT(indexer_candidate_key(-0.0f, 3), indexer_candidate_key(0.0f, 5));
  // No visible key, and NaN (never a reference score), are "no candidate".
  EXPECT_EQ(indexer_candidate_key(-kInf, 0), 0);
  EXPECT_EQ(indexer_candidate_key(std::nanf(""), 0), 0);
}

TEST(IndexerDcp, ForcedBlocksAreLocalAndInitialOnes) {
  const IndexerParams p{0, 16, 2, 1};
  EXPECT_TRUE(indexer_forced_block(9, 9, p));
  EXPECT_TRUE(indexer_forced_block(8, 9, p));
  EXPECT_FALSE(indexer_forced_block(7, 9, p));
  EXPECT_TRUE(indexer_forced_block(0, 9, p));
  EXPECT_FALSE(indexer_forced_block(10, 9, p));  // not visible
  EXPECT_FALSE(indexer_forced_block(3, 5, IndexerParams{0, 16, 0, 0}));
}

}  // namespace
}  // namespace m3
