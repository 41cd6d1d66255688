// Page-table width buckets of CUDA graph keys (kernels/cuda/backend/cuda_graphs.h): powers of two
// from 16, covering the pages asked for, none beyond kMaxGraphPages.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/cuda/backend/cuda_graphs.h"

namespace m3::cuda {
namespace {

TEST(CudaGraphBucket, PowersOfTwoFromSixteen) {
  EXPECT_EQ(graph_pages_bucket(0), 16);
  EXPECT_EQ(graph_pages_bucket(1), 16);
  EXPECT_EQ(graph_pages_bucket(16), 16);
  EXPECT_EQ(graph_pages_bucket(17), 32);
  EXPECT_EQ(graph_pages_bucket(64), 64);
  EXPECT_EQ(graph_pages_bucket(65), 128);
  EXPECT_EQ(graph_pages_bucket(1024), 1024);  // 128K tokens of 128-token pages
  for (int pages = 1; pages <= kMaxGraphPages; pages += 37) {
    const int b = graph_pages_bucket(pages);
    EXPECT_GE(b, pages);
    EXPECT_LT(b, 2 * std::max(pages, 16)) << pages;
    EXPECT_EQ(b & (b - 1), 0) << pages;
  }
}

TEST(CudaGraphBucket, NoGraphBeyondTheCap) {
  EXPECT_EQ(graph_pages_bucket(kMaxGraphPages), kMaxGraphPages);
  EXPECT_EQ(graph_pages_bucket(kMaxGraphPages + 1), 0);
}

}  // namespace
}  // namespace m3::cuda
