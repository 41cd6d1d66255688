// make_parallel_layout on small geometries whose head and expert counts divide only some sizes:
// the slices each rank holds (worked out by hand below), KV head replication past the KV head
// count, vocabulary padding, expert parallel and DEP, and the errors of layouts that do not fit.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "parallel/layout.h"

namespace m3 {
namespace {

// 12 query heads in 2 KV groups of 6, one index head per group, 8 experts, vocab 1001 (odd).
ModelGeometry geometry_a() {
  ModelGeometry g;
  g.num_heads = 12;
  g.num_kv_heads = 2;
  g.head_dim = 16;
  g.index_heads = 2;
  g.num_experts = 8;
  g.moe_intermediate_size = 64;
  g.shared_intermediate_size = 48;
  g.dense_intermediate_size = 96;
  g.vocab_size = 1001;
  return g;
}

// 6 query heads in 3 KV groups, 6 experts of width 96 (intermediates divide by 2 and 3).
ModelGeometry geometry_b() {
  ModelGeometry g = geometry_a();
  g.num_heads = 6;
  g.num_kv_heads = 3;
  g.index_heads = 3;
  g.num_experts = 6;
  g.moe_intermediate_size = 96;
  return g;
}

ParallelConfig config(int tp, int dp = 1, bool ep = false) { return ParallelConfig{tp, dp, ep}; }

// The message of the m3::Error `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelLayout, OneRankHoldsEverything) {
  const ParallelLayout l = make_parallel_layout(config(1), geometry_a());
  ASSERT_EQ(l.ranks.size(), 1u);
  const RankShard& r = l.ranks[0];
  EXPECT_EQ(r.q_heads, (Slice{0, 12}));
  EXPECT_EQ(r.kv_heads, (Slice{0, 2}));
  EXPECT_EQ(r.index_heads, (Slice{0, 2}));
  EXPECT_EQ(r.experts, (Slice{0, 8}));
  EXPECT_EQ(r.expert_intermediate, (Slice{0, 64}));
  EXPECT_EQ(r.vocab, (Slice{0, 1001}));
  EXPECT_EQ(l.padded_vocab_size, 1001);
  EXPECT_FALSE(l.attention_data_parallel());
}

TEST(ParallelLayout, Tp2SplitsHeadsKvHeadsIntermediatesAndPaddedVocab) {
  const ParallelLayout l = make_parallel_layout(config(2), geometry_a());
  ASSERT_EQ(l.ranks.size(), 2u);
  const RankShard& r1 = l.ranks[1];
  EXPECT_EQ(r1.tp_rank, 1);
  EXPECT_EQ(r1.q_heads, (Slice{6, 6}));  // 12 / 2
  EXPECT_EQ(r1.kv_heads, (Slice{1, 1}));  // its query heads 6..11 read KV head 1
  EXPECT_EQ(r1.index_heads, (Slice{1, 1}));
  EXPECT_EQ(r1.dense_intermediate, (Slice{48, 48}));
  EXPECT_EQ(r1.shared_intermediate, (Slice{24, 24}));
  EXPECT_EQ(r1.experts, (Slice{0, 8}));  // no expert parallel: every expert, half its width
  EXPECT_EQ(r1.expert_intermediate, (Slice{32, 32}));
  // 1001 padded up to 1002 = 2 x 501.
  EXPECT_EQ(l.padded_vocab_size, 1002);
  EXPECT_EQ(r1.vocab, (Slice{501, 501}));
  EXPECT_EQ(l.kv_head_replicas, 1);
}

TEST(ParallelLayout, Tp4ReplicatesEachKvHeadOverTwoRanks) {
  const ParallelLayout l = make_parallel_layout(config(4), geometry_a());
  EXPECT_EQ(l.kv_head_replicas, 2);
  // Query heads 3 per rank: ranks 0, 1 hold heads 0..5 (KV group 0), ranks 2, 3 heads 6..11.
  const int64_t expected_kv[4] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(l.ranks[r].q_heads, (Slice{3 * r, 3}));
    EXPECT_EQ(l.ranks[r].kv_heads, (Slice{expected_kv[r], 1})) << "rank " << r;
    EXPECT_EQ(l.ranks[r].index_heads, (Slice{expected_kv[r], 1})) << "rank " << r;
  }
  // 1001 -> 1004 = 4 x 251; the last slice [753, 1004) runs 3 rows past the vocabulary.
  EXPECT_EQ(l.padded_vocab_size, 1004);
  EXPECT_EQ(l.ranks[3].vocab, (Slice{753, 251}));
}

TEST(ParallelLayout, Tp3OnThreeKvGroups) {
  const ParallelLayout l = make_parallel_layout(config(3), geometry_b());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(l.ranks[r].q_heads, (Slice{2 * r, 2}));
    EXPECT_EQ(l.ranks[r].kv_heads, (Slice{r, 1}));
  }
  EXPECT_EQ(l.padded_vocab_size, 1002);  // 3 x 334
  EXPECT_EQ(l.ranks[2].vocab, (Slice{668, 334}));
}

TEST(ParallelLayout, IndexHeadsFollowTheirKvGroup) {
  ModelGeometry g = geometry_a();
  g.index_heads = 4;  // two per KV group
  const ParallelLayout l = make_parallel_layout(config(2), g);
  EXPECT_EQ(l.ranks[0].index_heads, (Slice{0, 2}));
  EXPECT_EQ(l.ranks[1].index_heads, (Slice{2, 2}));
}

TEST(ParallelLayout, IndexHeadsThatDoNotFollowKvGroupsSplitNowhere) {
  ModelGeometry g = geometry_a();
  g.index_heads = 3;  // 1.5 per KV group: one rank holds them all, two cannot share them
  EXPECT_EQ(make_parallel_layout(config(1), g).ranks[0].index_heads, (Slice{0, 3}));
  EXPECT_EQ(error_of([&] { make_parallel_layout(config(2), g); }),
            "-tp 2: index_n_heads 3 is not a multiple of num_key_value_heads 2, so the index heads cannot follow "
            "their KV groups onto the ranks");
}

TEST(ParallelLayout, ExpertParallel2And4SplitWholeExperts) {
  const ParallelLayout ep2 = make_parallel_layout(config(2, 1, true), geometry_a());
  EXPECT_EQ(ep2.expert_parallel_size, 2);
  EXPECT_EQ(ep2.ranks[1].experts, (Slice{4, 4}));
  EXPECT_EQ(ep2.ranks[1].expert_intermediate, (Slice{0, 64}));  // whole experts
  EXPECT_EQ(ep2.ranks[1].ep_rank, 1);
  // EP 4 = -tp 2 x --data-parallel-size 2: ranks dp-major, 2 experts each; attention TP within a copy.
  const ParallelLayout ep4 = make_parallel_layout(config(2, 2, true), geometry_a());
  ASSERT_EQ(ep4.ranks.size(), 4u);
  EXPECT_EQ(ep4.expert_parallel_size, 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ep4.ranks[r].experts, (Slice{2 * r, 2}));
    EXPECT_EQ(ep4.ranks[r].dp_rank, r / 2);
    EXPECT_EQ(ep4.ranks[r].q_heads, (Slice{6 * (r % 2), 6}));
  }
  EXPECT_TRUE(ep4.attention_data_parallel());
}

TEST(ParallelLayout, Dep2HoldsWholeAttentionAndHalfTheExperts) {
  const ParallelLayout l = make_parallel_layout(config(1, 2, true), geometry_a());
  ASSERT_EQ(l.ranks.size(), 2u);
  EXPECT_TRUE(l.attention_data_parallel());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(l.ranks[r].q_heads, (Slice{0, 12}));
    EXPECT_EQ(l.ranks[r].kv_heads, (Slice{0, 2}));
    EXPECT_EQ(l.ranks[r].vocab, (Slice{0, 1001}));
    EXPECT_EQ(l.ranks[r].experts, (Slice{4 * r, 4}));
  }
}

// DEP with tensor-parallel copies: every copy splits its attention, dense and shared-expert
// weights and vocabulary as -tp alone does (by tp rank), the experts go by global rank.
TEST(ParallelLayout, DepCopiesOfSeveralRanksSplitAsTpAndShareTheExperts) {
  const ParallelLayout l = make_parallel_layout(config(3, 2, true), geometry_b());
  ASSERT_EQ(l.ranks.size(), 6u);
  EXPECT_TRUE(l.attention_data_parallel());
  EXPECT_EQ(l.expert_parallel_size, 6);
  EXPECT_EQ(l.padded_vocab_size, 1002);
  for (int r = 0; r < 6; ++r) {
    const RankShard& s = l.ranks[r];
    EXPECT_EQ(s.dp_rank, r / 3);
    EXPECT_EQ(s.tp_rank, r % 3);
    EXPECT_EQ(s.ep_rank, r);
    EXPECT_EQ(s.q_heads, (Slice{2 * (r % 3), 2}));
    EXPECT_EQ(s.kv_heads, (Slice{r % 3, 1}));
    EXPECT_EQ(s.index_heads, (Slice{r % 3, 1}));
    EXPECT_EQ(s.shared_intermediate, (Slice{16 * (r % 3), 16}));
    EXPECT_EQ(s.dense_intermediate, (Slice{32 * (r % 3), 32}));
    EXPECT_EQ(s.vocab, (Slice{334 * (r % 3), 334}));
    EXPECT_EQ(s.experts, (Slice{r, 1}));
    EXPECT_EQ(s.expert_intermediate, (Slice{0, 96}));
  }
  // Copies of 4 ranks over 2 KV heads replicate each over two ranks of the copy, as -tp 4 does.
  const ParallelLayout wide = make_parallel_layout(config(4, 2, true), geometry_a());
  EXPECT_EQ(wide.kv_head_replicas, 2);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(wide.ranks[r].kv_heads, (Slice{(r % 4) / 2, 1}));
    EXPECT_EQ(wide.ranks[r].q_heads, (Slice{3 * (r % 4), 3}));
    EXPECT_EQ(wide.ranks[r].experts, (Slice{r, 1}));
  }
}

TEST(ParallelLayout, DataParallelWithoutExpertParallelCopiesEverything) {
  const ParallelLayout l = make_parallel_layout(config(1, 2, false), geometry_a());
  EXPECT_EQ(l.ranks[1].experts, (Slice{0, 8}));
  EXPECT_EQ(l.ranks[1].expert_intermediate, (Slice{0, 64}));
  EXPECT_EQ(l.expert_parallel_size, 1);
}

TEST(ParallelLayout, FullSizeM3AtTp4AndTp8) {
  ModelGeometry g;
  g.num_heads = 64;
  g.num_kv_heads = 4;
  g.head_dim = 128;
  g.index_heads = 4;
  g.num_experts = 128;
  g.moe_intermediate_size = 3072;
  g.shared_intermediate_size = 3072;
  g.dense_intermediate_size = 12288;
  g.vocab_size = 200064;
  // docs/reference.md 3.4: at TP4 a rank holds 16 query heads, 1 KV head and 1 index head.
  const ParallelLayout tp4 = make_parallel_layout(config(4), g);
  EXPECT_EQ(tp4.ranks[2].q_heads, (Slice{32, 16}));
  EXPECT_EQ(tp4.ranks[2].kv_heads, (Slice{2, 1}));
  EXPECT_EQ(tp4.ranks[2].index_heads, (Slice{2, 1}));
  EXPECT_EQ(tp4.ranks[2].vocab, (Slice{100032, 50016}));  // 200064 = 4 x 50016, no padding
  const ParallelLayout tp8 = make_parallel_layout(config(8), g);
  EXPECT_EQ(tp8.kv_head_replicas, 2);
  EXPECT_EQ(tp8.ranks[5].kv_heads, (Slice{2, 1}));
  EXPECT_EQ(tp8.ranks[5].q_heads, (Slice{40, 8}));
  ModelGeometry h = g;
  h.num_heads = 80;  // 5 x 16 query heads, but 5 ranks cannot share 4 KV heads evenly
  EXPECT_EQ(error_of([&] { make_parallel_layout(config(5), h); }),
            "-tp 5: more ranks than num_key_value_heads 4, so each KV head is replicated, and 5 is not a multiple "
            "of 4");
}

TEST(ParallelLayout, BadLayoutsNameTheOptionAndTheDimension) {
  EXPECT_EQ(error_of([] { make_parallel_layout(config(5), geometry_a()); }),
            "-tp 5: num_attention_heads 12 is not a multiple of 5");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(2), geometry_b()); }),
            "-tp 2: num_key_value_heads 3 is not a multiple of 2");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(3), geometry_a()); }),
            "-tp 3: more ranks than num_key_value_heads 2, so each KV head is replicated, and 3 is not a multiple "
            "of 2");
  ModelGeometry odd_dense = geometry_a();
  odd_dense.dense_intermediate_size = 90;
  EXPECT_EQ(error_of([&] { make_parallel_layout(config(4), odd_dense); }),
            "-tp 4: dense_intermediate_size 90 is not a multiple of 4");
  ModelGeometry odd_expert = geometry_a();
  odd_expert.moe_intermediate_size = 66;
  EXPECT_EQ(error_of([&] { make_parallel_layout(config(4), odd_expert); }),
            "-tp 4: intermediate_size (one routed expert) 66 is not a multiple of 4");
  // Expert parallel lifts that constraint: experts stay whole.
  EXPECT_EQ(error_of([&] { make_parallel_layout(config(4, 1, true), odd_expert); }), "");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(4, 4, true), geometry_a()); }),
            "--enable-expert-parallel: EP size 16 (-tp 4 x --data-parallel-size 4) is more ranks than "
            "num_local_experts 8; a rank would hold no expert");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(1, 4, true), geometry_b()); }),
            "--enable-expert-parallel: num_local_experts 6 is not a multiple of the EP size 4 (-tp 1 x "
            "--data-parallel-size 4)");
  // Under DEP the message says the -tp ranks are each copy's.
  EXPECT_EQ(error_of([] { make_parallel_layout(config(2, 3, true), geometry_b()); }),
            "-tp 2 (the ranks of each of the --data-parallel-size 3 copies): num_key_value_heads 3 is not a multiple "
            "of 2");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(5, 2, true), geometry_a()); }),
            "-tp 5 (the ranks of each of the --data-parallel-size 2 copies): num_attention_heads 12 is not a "
            "multiple of 5");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(3, 4, true), geometry_b()); }),
            "--enable-expert-parallel: EP size 12 (-tp 3 x --data-parallel-size 4) is more ranks than "
            "num_local_experts 6; a rank would hold no expert");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(0), geometry_a()); }),
            "-tp/--tensor-parallel-size must be >= 1, got 0");
  EXPECT_EQ(error_of([] { make_parallel_layout(config(1, 0), geometry_a()); }),
            "--data-parallel-size must be >= 1, got 0");
}

}  // namespace
}  // namespace m3
