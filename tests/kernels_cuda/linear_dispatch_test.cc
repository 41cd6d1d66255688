// Which linear kernel takes a problem (kernels/cuda/backend/linear.cu, linear_streamed.cu) and how
// many splits of K a dense wgmma launch takes (linear_wgmma.cu), checked on the host without a GPU:
// the streamed kernel copies weight and scale rows with 16-byte cp.async, so a misaligned row, a
// scale row that is not whole 16-byte words, or a table not checked as a whole must never reach it
// (the copy would fault or read past a row); items above 16 rows go to the skinny or wgmma kernels.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/cuda/backend/backend_kernels.h"

namespace m3::cuda::detail {
namespace {

// Views are only inspected, never read: their pointers are plain addresses.
const uint8_t* at(uintptr_t address) { return reinterpret_cast<const uint8_t*>(address); }

WeightView nvfp4(int k, uintptr_t data = 0x10000, uintptr_t scale = 0x20000) {
  WeightView w;
  w.kind = WeightKind::kNvfp4;
  w.data = at(data);
  w.row_bytes = k / 2;
  w.scale = at(scale);
  w.scale_stride = k / 16;
  return w;
}

WeightView mxfp8(int k) {
  WeightView w;
  w.kind = WeightKind::kMxfp8;
  w.data = at(0x10000);
  w.row_bytes = k;
  w.scale = at(0x20000);
  w.scale_stride = k / 32;
  return w;
}

WeightView dense(WeightKind kind, int k, int bytes_per_element) {
  WeightView w;
  w.kind = kind;
  w.data = at(0x10000);
  w.row_bytes = int64_t(k) * bytes_per_element;
  return w;
}

LinearArgs args_for(const WeightView& w, int k, int rows) {
  LinearArgs a;
  a.x = reinterpret_cast<const uint16_t*>(0x40000);
  a.x_stride = k;
  a.rows = rows;
  a.n = 4096;
  a.k = k;
  a.w[0] = w;
  a.item_rows = linear_item_rows(w, k, a.n, rows);
  return a;
}

TEST(LinearDispatch, StreamedWeightsNeedAlignedRowsAndWholeScaleWords) {
  EXPECT_TRUE(streamed_weight_ok(nvfp4(6144)));   // M3.1 gate/up: scale rows of 384 bytes
  EXPECT_TRUE(streamed_weight_ok(nvfp4(3072)));   // down: 192
  EXPECT_TRUE(streamed_weight_ok(nvfp4(256)));    // 16
  EXPECT_FALSE(streamed_weight_ok(nvfp4(384)));   // 24-byte scale rows
  EXPECT_FALSE(streamed_weight_ok(nvfp4(128)));   // 8
  EXPECT_FALSE(streamed_weight_ok(nvfp4(6144, 0x10008)));           // data not 16-byte aligned
  EXPECT_FALSE(streamed_weight_ok(nvfp4(6144, 0x10000, 0x20004)));  // scales not 16-byte aligned
  EXPECT_TRUE(streamed_weight_ok(mxfp8(6144)));   // 192-byte scale rows
  EXPECT_TRUE(streamed_weight_ok(mxfp8(512)));
  EXPECT_FALSE(streamed_weight_ok(mxfp8(384)));   // 12
  WeightView no_scale = mxfp8(6144);
  no_scale.scale = nullptr;
  EXPECT_FALSE(streamed_weight_ok(no_scale));
  EXPECT_TRUE(streamed_weight_ok(dense(WeightKind::kBF16, 384, 2)));
  EXPECT_TRUE(streamed_weight_ok(dense(WeightKind::kFp8, 384, 1)));  // per-tensor scale: no scale rows
  EXPECT_FALSE(streamed_weight_ok(dense(WeightKind::kBF16, 100, 2)));  // 200-byte rows
  EXPECT_FALSE(streamed_weight_ok(dense(WeightKind::kF32, 384, 4)));   // no bf16 expansion
  EXPECT_FALSE(streamed_weight_ok(dense(WeightKind::kF16, 384, 2)));
}

TEST(LinearDispatch, StreamedKernelTakesItemsOfSixteenToSixtyFourRows) {
  const WeightView w = nvfp4(6144);
  for (int rows : {1, 5, 16}) {
    const LinearArgs a = args_for(w, 6144, rows);
    EXPECT_EQ(a.item_rows, 16) << rows;
    EXPECT_TRUE(streamed_linear_ok(a)) << rows;  // the narrow form
  }
  for (int rows : {17, 64, 200}) {
    const LinearArgs a = args_for(w, 6144, rows);
    EXPECT_TRUE(a.item_rows == 32 || a.item_rows == 64) << rows;
    EXPECT_TRUE(streamed_linear_ok(a)) << rows;  // the wide form (dense rows up to 256)
  }
  EXPECT_FALSE(streamed_linear_ok(args_for(w, 6144, 2048)));  // wgmma tiles
  // A batch-invariant launch keeps 16-row items at any row count: streamed throughout.
  LinearArgs invariant = args_for(w, 6144, 2048);
  invariant.item_rows = kBatchInvariantItemRows;
  EXPECT_TRUE(streamed_linear_ok(invariant));
}

TEST(LinearDispatch, StreamedKernelChecksActivationsEveryWeightAndTables) {
  const WeightView w = nvfp4(6144);
  LinearArgs a = args_for(w, 6144, 1);
  a.x_stride = 6148;  // rows of x not whole 16-byte chunks
  EXPECT_FALSE(streamed_linear_ok(a));
  a = args_for(w, 6144, 1);
  a.x = reinterpret_cast<const uint16_t*>(0x40008);
  EXPECT_FALSE(streamed_linear_ok(a));

  // SwiGLU: the up projection must pass too.
  a = args_for(w, 6144, 1);
  a.epilogue = Epilogue::kSwiglu;
  a.w[1] = w;
  EXPECT_TRUE(streamed_linear_ok(a));
  a.w[1] = nvfp4(6144, 0x10008);
  EXPECT_FALSE(streamed_linear_ok(a));

  // Grouped (MoE): only the host's check of the whole table counts, not w[0].
  WeightView table[2] = {w, w};
  a = args_for(w, 6144, 1);
  a.table[0] = table;
  EXPECT_FALSE(streamed_linear_ok(a));
  a.table_streamed_ok = true;
  EXPECT_TRUE(streamed_linear_ok(a));

  // Segments (the fused projections): every segment.
  a = args_for(mxfp8(6144), 6144, 1);
  a.num_segments = 3;
  for (int s = 0; s < 3; ++s) a.seg[s].w = mxfp8(6144);
  EXPECT_TRUE(streamed_linear_ok(a));
  a.seg[2].w.data = at(0x10008);
  EXPECT_FALSE(streamed_linear_ok(a));
}

TEST(LinearDispatch, WgmmaKernelTakesLargeItemsAndGroupedSixtyFourRowItems) {
  const WeightView w = nvfp4(6144);
  const LinearItem items[1] = {};
  const int32_t num_items = 1;
  for (int rows : {1, 17, 64, 200}) {
    LinearArgs dense = args_for(w, 6144, rows);
    EXPECT_FALSE(linear_runs_wgmma(dense)) << rows;  // decode batches: streamed / skinny
    LinearArgs grouped = dense;
    grouped.items = items;
    grouped.num_items = &num_items;
    grouped.item_rows = linear_item_rows(w, 6144, 0, rows, /*grouped=*/true);
    // Experts of 33-64 rows: the 64-row size; fewer rows stay on the streamed kernel.
    EXPECT_EQ(linear_runs_wgmma(grouped), rows > 32) << rows;
  }
  EXPECT_TRUE(linear_runs_wgmma(args_for(w, 6144, 2048)));
  // Batch-invariant mode's 16-row items never reach it.
  LinearArgs invariant = args_for(w, 6144, 2048);
  invariant.items = items;
  invariant.num_items = &num_items;
  invariant.item_rows = kBatchInvariantItemRows;
  EXPECT_FALSE(linear_runs_wgmma(invariant));
}

TEST(LinearDispatch, RowsPerItem) {
  const WeightView w = mxfp8(6144);
  EXPECT_EQ(linear_item_rows(w, 6144, 512, 1), 16);
  EXPECT_EQ(linear_item_rows(w, 6144, 512, 32), 32);
  // A wide dense layer (6144 weight rows and more) of 33-64 rows: the wgmma kernel's 64-row size;
  // up to 32 rows the streamed kernel.
  EXPECT_EQ(linear_item_rows(w, 6144, 8192, 64), kWgmmaItemRows);
  EXPECT_EQ(linear_item_rows(w, 6144, 6144, 33), kWgmmaItemRows);
  EXPECT_EQ(linear_item_rows(w, 6144, 9856, 32), 32);
  EXPECT_EQ(linear_item_rows(w, 6144, 4096, 40), 64);  // narrower: the streamed kernel's wide form
  EXPECT_EQ(linear_item_rows(w, 6144, 9856, 40, true), 64);  // grouped: experts of 33-64 rows
  EXPECT_EQ(linear_item_rows(w, 6144, 512, 200), 64);     // a narrow dense layer: streamed up to 256 rows
  EXPECT_EQ(linear_item_rows(w, 6144, 0, 200), 64);       // a fused launch's segments
  EXPECT_EQ(linear_item_rows(w, 6144, 4096, 128), 64);               // 32 CTAs: streamed up to 256 rows
  EXPECT_EQ(linear_item_rows(w, 6144, 6144, 65), kWgmmaItemRows);     // 48 CTAs: wgmma from 65 rows
  EXPECT_EQ(linear_item_rows(w, 6144, 0, 200, true), kWgmmaItemRows);  // grouped: wgmma tiles
  EXPECT_EQ(linear_item_rows(w, 6144, 512, 300), kWgmmaItemRows);
  // No tensor-core path (f32): 16-row items for the exact SIMT kernel.
  EXPECT_EQ(linear_item_rows(dense(WeightKind::kF32, 384, 4), 384, 8192, 300), 16);
}

// Items of up to 320 rows (wgmma_max_item_rows): grouped lists of NVFP4 weights (M3.1's routed
// experts) only; other kinds and every dense launch keep 256.
TEST(LinearDispatch, WideItems) {
  EXPECT_EQ(wgmma_max_item_rows(WeightKind::kNvfp4), kWgmmaWideItemRows);
  EXPECT_EQ(wgmma_max_item_rows(WeightKind::kMxfp8), kWgmmaItemRows);
  EXPECT_EQ(wgmma_max_item_rows(WeightKind::kFp8), kWgmmaItemRows);
  EXPECT_EQ(wgmma_max_item_rows(WeightKind::kBF16), kWgmmaItemRows);
  const WeightView fp4 = nvfp4(6144), mx = mxfp8(6144);
  EXPECT_EQ(linear_item_rows(fp4, 6144, 0, 200, /*grouped=*/true), kWgmmaWideItemRows);
  EXPECT_EQ(linear_item_rows(mx, 6144, 0, 200, /*grouped=*/true), kWgmmaItemRows);
  EXPECT_EQ(linear_item_rows(fp4, 6144, 0, 40, /*grouped=*/true), 64);
  for (int rows : {257, 300, 1100, 8192, 70000}) {
    EXPECT_EQ(linear_item_rows(fp4, 6144, 9856, rows), kWgmmaItemRows) << rows;
    EXPECT_EQ(linear_item_rows(mx, 6144, 9856, rows), kWgmmaItemRows) << rows;
  }
}

// The wgmma split-K rule's model (waves x (steps a split + a fixed cost)). Clusters that fit at
// once, by split count: 132 CTAs alone and 39 clusters of 3 as an H100 reported them (ncu, session
// 37); the others assumed from GPC packing, consistent with the H100's choice of 2 splits for o_proj
// and the dense down projection (fewer than 24 clusters of 5, fewer than 16 of 8).
constexpr int kFit[kWgmmaMaxKSplits] = {132, 66, 39, 30, 22, 18, 14, 14};

TEST(LinearDispatch, SplitCountFusedProjections) {
  // 77 tiles of 96 steps: unsplit, one wave of 96 + 8; 3 splits, two waves of 32 + 8 (the sweep's
  // best: 66.0 us against 68.8 unsplit at 128 rows); 2 splits, two waves of 48 + 8.
  EXPECT_EQ(wgmma_split_count(77, 96, kFit, kWgmmaMaxKSplits), 3);
}

TEST(LinearDispatch, SplitCountOneWaveWhenItFits) {
  // o_proj: 48 tiles of 128 steps. Two splits fit one wave (64 + 8); four take two (2 x 40).
  EXPECT_EQ(wgmma_split_count(48, 128, kFit, kWgmmaMaxKSplits), 2);
  // The dense layers' down projection: 48 tiles of 192 steps, two splits as well.
  EXPECT_EQ(wgmma_split_count(48, 192, kFit, kWgmmaMaxKSplits), 2);
  // Few tiles: one wave at every count, so the most steps off each CTA: 16 tiles of 96 steps take
  // 6 splits (16 + 8), 7 and 8 need two waves of 14 clusters.
  EXPECT_EQ(wgmma_split_count(16, 96, kFit, kWgmmaMaxKSplits), 6);
}

TEST(LinearDispatch, SplitCountLimits) {
  // Every split keeps kWgmmaMinSplitSteps steps: 20 steps allow no split.
  EXPECT_EQ(wgmma_split_count(8, 20, kFit, kWgmmaMaxKSplits), 1);
  // A count whose query failed (fit <= 0) ends the search.
  const int failed[kWgmmaMaxKSplits] = {132, 0, 44, 33, 26, 22, 18, 16};
  EXPECT_EQ(wgmma_split_count(48, 128, failed, kWgmmaMaxKSplits), 1);
  // Only the counts that were queried.
  EXPECT_EQ(wgmma_split_count(16, 96, kFit, 4), 4);
  EXPECT_EQ(wgmma_split_count(8, 1024, kFit, 1), 1);
  // Ties go to fewer splits: 48 tiles of 128 steps with 16 clusters of 8 model 72 at 8 splits
  // (3 x (16 + 8)) as at 2 (64 + 8).
  const int tie8[kWgmmaMaxKSplits] = {132, 66, 10, 10, 10, 10, 10, 16};
  EXPECT_EQ(wgmma_split_count(48, 128, tie8, kWgmmaMaxKSplits), 2);
}

}  // namespace
}  // namespace m3::cuda::detail
