// engine/lane_router: a conversation's turns go back to the lane that took its prefix; unrelated
// prompts, and a preferred lane past the slack, go to the lane with the fewest in flight; the
// table stays within its capacity.
#include <gtest/gtest.h>

#include <vector>

#include "engine/lane_router.h"

namespace m3 {
namespace {

constexpr int kBlock = 4;

std::vector<int32_t> tokens(int seed, int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = seed * 1000 + i;
  return t;
}

std::vector<int32_t> extended(std::vector<int32_t> prefix, int seed, int n) {
  const std::vector<int32_t> more = tokens(seed, n);
  prefix.insert(prefix.end(), more.begin(), more.end());
  return prefix;
}

TEST(LaneRouter, ATurnGoesBackToTheLaneOfItsPrefix) {
  LaneRouter router(3, kBlock, 1000);
  const std::vector<int32_t> a = tokens(1, 10), b = tokens(2, 10);
  EXPECT_EQ(router.choose(a, std::vector<int>{0, 0, 0}), 0);  // nothing matches: the fewest, lowest index
  EXPECT_EQ(router.choose(b, std::vector<int>{1, 0, 0}), 1);
  // a's next turn (a's prompt, then more): back to lane 0 although lane 2 is idle.
  EXPECT_EQ(router.choose(extended(a, 3, 9), std::vector<int>{1, 1, 0}), 0);
  // b's, likewise, even with lane 1 a little busier than the others (within the slack of 2).
  EXPECT_EQ(router.choose(extended(b, 4, 6), std::vector<int>{1, 3, 1}), 1);
  // Past the slack the least busy lane takes it, and from then on owns the prefix.
  const std::vector<int32_t> b3 = extended(b, 5, 6);
  EXPECT_EQ(router.choose(b3, std::vector<int>{0, 5, 1}), 0);
  EXPECT_EQ(router.choose(extended(b3, 6, 4), std::vector<int>{2, 0, 0}), 0);
  // A prompt shorter than a block, or one that shares no full block, balances.
  EXPECT_EQ(router.choose(tokens(7, 3), std::vector<int>{2, 1, 0}), 2);
  std::vector<int32_t> near_a = a;
  near_a[1] += 1;  // differs inside the first block: no shared full block
  EXPECT_EQ(router.choose(near_a, std::vector<int>{0, 1, 1}), 0);
  EXPECT_EQ(router.choose(near_a, std::vector<int>{3, 1, 0}), 2);  // 3 > 0 + 2: past the slack
}

TEST(LaneRouter, TheSlackGrowsWithTheLoad) {
  LaneRouter router(2, kBlock, 1000);
  const std::vector<int32_t> a = tokens(1, 8);
  EXPECT_EQ(router.choose(a, std::vector<int>{0, 0}), 0);
  // With 40 in flight on the least busy lane the slack is 2 + 10: 52 still keeps the prefix.
  EXPECT_EQ(router.choose(extended(a, 2, 4), std::vector<int>{52, 40}), 0);
  EXPECT_EQ(router.choose(extended(a, 3, 4), std::vector<int>{53, 40}), 1);
}

TEST(LaneRouter, TheTableKeepsItsCapacityDroppingTheOldest) {
  LaneRouter router(2, kBlock, 6);
  const std::vector<int32_t> old_prompt = tokens(1, 12);  // 3 blocks
  EXPECT_EQ(router.choose(old_prompt, std::vector<int>{0, 0}), 0);
  for (int i = 0; i < 3; ++i) router.choose(tokens(10 + i, 8), std::vector<int>{5, 0});  // 6 newer blocks
  EXPECT_EQ(router.size(), 6);
  // old_prompt's blocks are gone: its next turn balances instead of going back to lane 0.
  EXPECT_EQ(router.choose(extended(old_prompt, 2, 4), std::vector<int>{1, 0}), 1);
  EXPECT_LE(router.size(), 6);
}

}  // namespace
}  // namespace m3
