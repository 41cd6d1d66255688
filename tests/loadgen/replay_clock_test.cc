// The whole-system idle cap: with nothing in flight, waits end once the system has been idle
// for the cap (the clock skips ahead and the other waits keep their distance to it); with a
// request in flight nothing is skipped; stop ends every wait.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "loadgen/replay_clock.h"

namespace m3::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(ReplayClock, IdleTimePastTheCapIsSkipped) {
  ReplayClock clock(0.05);
  const auto start = Clock::now();
  double first_end = 0, second_end = 0;
  // Two agents wait 100 s and 102 s: the first ends after the cap of idleness, the second one
  // cap after it (still idle: the clock jumps again), not 2 s after it.
  std::thread a([&] {
    EXPECT_TRUE(clock.wait(100.0));
    first_end = seconds_since(start);
  });
  std::thread b([&] {
    EXPECT_TRUE(clock.wait(102.0));
    second_end = seconds_since(start);
  });
  a.join();
  b.join();
  EXPECT_LT(first_end, 1.0);
  EXPECT_GT(second_end - first_end, 0.04);
  EXPECT_LT(second_end - first_end, 1.5);
  EXPECT_LT(second_end, 3.0);
  EXPECT_GT(clock.skipped_s(), 101.0);
}

TEST(ReplayClock, NothingIsSkippedWhileARequestIsInFlight) {
  ReplayClock clock(0.01);
  clock.request_started();
  const auto start = Clock::now();
  EXPECT_TRUE(clock.wait(0.3));
  EXPECT_GT(seconds_since(start), 0.29);
  EXPECT_EQ(clock.skipped_s(), 0.0);
  clock.request_finished();
  const auto again = Clock::now();
  EXPECT_TRUE(clock.wait(50.0));  // idle now: skipped after the cap
  EXPECT_LT(seconds_since(again), 1.0);
}

TEST(ReplayClock, NoCapSkipsNothingAndStopEndsWaits) {
  ReplayClock clock(-1);
  const auto start = Clock::now();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    clock.stop();
  });
  EXPECT_FALSE(clock.wait(30.0));
  stopper.join();
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(clock.skipped_s(), 0.0);
  EXPECT_FALSE(clock.wait(1.0));
  clock.wait_for_stop(5.0);  // returns at once: stopped
}

}  // namespace
}  // namespace m3::loadgen
