// The decode floor's rate (Backend::measure_copy_rate) on the CPU backend: a real copy timed,
// its arguments checked.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"

namespace m3 {
namespace {

TEST(CopyRate, CpuBackendTimesACopyOfHostMemory) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const double rate = cpu->measure_copy_rate(int64_t{1} << 24, 2);
  // Bytes read plus written a second: finite, and between a slow disk's and a GPU's.
  EXPECT_TRUE(std::isfinite(rate));
  EXPECT_GT(rate, 1e8);
  EXPECT_LT(rate, 1e13);
}

TEST(CopyRate, RejectsBuffersTooSmallToMeanAnything) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  EXPECT_THROW(cpu->measure_copy_rate(4096, 2), Error);
  EXPECT_THROW(cpu->measure_copy_rate(int64_t{1} << 24, 0), Error);
}

}  // namespace
}  // namespace m3
