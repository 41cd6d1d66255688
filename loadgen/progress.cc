#include "loadgen/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fmt/core.h>

namespace m3::loadgen {

ProgressLine::ProgressLine(const LiveCounters& live, std::string label, bool enabled)
    : live_(live), label_(std::move(label)) {
  if (!enabled || !::isatty(STDERR_FILENO)) return;
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto last = start;
    int64_t last_tokens = 0;
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const auto now = Clock::now();
      const int64_t tokens = live_.output_tokens;
      const double dt = std::chrono::duration<double>(now - last).count();
      const double rate = dt > 0 ? (tokens - last_tokens) / dt : 0.0;
      last = now;
      last_tokens = tokens;
      std::fprintf(stderr, "\r\033[K%s  done %lld  failed %lld  in flight %lld  %.0f out tok/s  %.0f s",
                   label_.c_str(), static_cast<long long>(live_.finished.load()),
                   static_cast<long long>(live_.failed.load()), static_cast<long long>(live_.in_flight.load()),
                   rate, std::chrono::duration<double>(now - start).count());
      std::fflush(stderr);
    }
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  });
}

ProgressLine::~ProgressLine() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace m3::loadgen
