#include "loadgen/replay_clock.h"

#include <algorithm>

namespace m3::loadgen {

ReplayClock::ReplayClock(double idle_cap_s) : idle_cap_s_(idle_cap_s) {}

bool ReplayClock::wait(double seconds) {
  std::unique_lock lock(mu_);
  if (stopped_) return false;
  if (seconds <= 0) return true;
  const double deadline = real_now() + skipped_ + seconds;
  const auto mine = deadlines_.insert(deadline);
  for (;;) {
    if (stopped_) break;
    const double now = real_now();
    const double left = deadline - (now + skipped_);
    if (left <= 0) break;
    double sleep = left;
    if (idle_cap_s_ >= 0 && in_flight_ == 0 && *deadlines_.begin() == deadline) {
      // This wait ends first: once the system has been idle for the cap, jump to its end.
      const double idle_left = idle_cap_s_ - (now - idle_since_);
      if (idle_left <= 0) {
        skipped_ += left;
        idle_since_ = now;  // the next skip needs another cap of idleness
        cv_.notify_all();   // the other waits are that much closer too
        break;
      }
      sleep = std::min(sleep, idle_left);
    }
    cv_.wait_for(lock, std::chrono::duration<double>(sleep));
  }
  deadlines_.erase(mine);
  return !stopped_;
}

void ReplayClock::wait_for_stop(double real_seconds) {
  std::unique_lock lock(mu_);
  if (real_seconds > 0) {
    cv_.wait_for(lock, std::chrono::duration<double>(real_seconds), [&] { return stopped_; });
  } else {
    cv_.wait(lock, [&] { return stopped_; });
  }
}

void ReplayClock::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

bool ReplayClock::stopped() {
  std::lock_guard lock(mu_);
  return stopped_;
}

void ReplayClock::request_started() {
  std::lock_guard lock(mu_);
  ++in_flight_;
}

void ReplayClock::request_finished() {
  {
    std::lock_guard lock(mu_);
    if (--in_flight_ == 0) idle_since_ = real_now();
  }
  cv_.notify_all();
}

double ReplayClock::skipped_s() {
  std::lock_guard lock(mu_);
  return skipped_;
}

}  // namespace m3::loadgen
