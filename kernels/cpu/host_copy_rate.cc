#include "kernels/cpu/host_copy_rate.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace m3 {

double measure_host_copy_rate(int64_t buffer_bytes, int repeats) {
  M3_CHECK(buffer_bytes >= (int64_t{1} << 20) && repeats >= 1, "host copy rate: a buffer of {} bytes, {} repeats",
           buffer_bytes, repeats);
  // Chunks of 1 MiB shared out statically, so each thread touches (first) and copies the same
  // pages every time: on a machine with several memory nodes each thread copies its own node's.
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t chunks = buffer_bytes / kChunk;
  const int64_t bytes = chunks * kChunk;
  std::unique_ptr<char[]> from(new char[bytes]), to(new char[bytes]);
  const auto copy = [&](bool first_touch) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      char* src = from.get() + c * kChunk;
      char* dst = to.get() + c * kChunk;
      if (first_touch) {
        std::memset(src, static_cast<int>(c & 0x7f), kChunk);
        std::memset(dst, 0, kChunk);
      }
      std::memcpy(dst, src, kChunk);
    }
  };
  copy(true);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    copy(false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s);
  }
  M3_CHECK(to[bytes - 1] == from[bytes - 1], "host copy rate: the copy did not land");
  return best;
}

}  // namespace m3
