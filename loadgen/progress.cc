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
    // The rate over the last 4 redraws (2 s): steady enough to read, recent enough to be live.
    constexpr int kWindow = 4;
    Clock::time_point times[kWindow + 1];
    int64_t counts[kWindow + 1] = {};
    for (auto& t : times) t = start;
    for (int tick = 1; !stop_; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const auto now = Clock::now();
      const int64_t tokens = live_.output_tokens;
      times[tick % (kWindow + 1)] = now;
      counts[tick % (kWindow + 1)] = tokens;
      const int oldest = tick < kWindow ? 0 : (tick + 1) % (kWindow + 1);
      const double dt = std::chrono::duration<double>(now - times[oldest]).count();
      const double rate = dt > 0 ? (tokens - counts[oldest]) / dt : 0.0;
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
