// The replay's clock: think-time waits, the stop of the run, and AgentX's whole-system idle cap.
// Waits run on a virtual clock (real time plus the idle time skipped so far): when no request
// has been in flight for `idle_cap_s`, the clock jumps to the earliest wait's end, so every
// other waiting agent keeps its recorded distance to it. With a negative cap nothing is skipped.
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

namespace m3::loadgen {

class ReplayClock {
 public:
  explicit ReplayClock(double idle_cap_s);

  // Waits `seconds` of virtual time; false when the run stopped meanwhile (or had stopped).
  bool wait(double seconds);
  // Waits until stop(), or `real_seconds` of real time when > 0 (the run's --duration).
  void wait_for_stop(double real_seconds = 0);
  void stop();
  bool stopped();

  // A request is in flight between these two calls (the system is not idle).
  void request_started();
  void request_finished();

  // Idle time skipped so far, seconds.
  double skipped_s();

 private:
  using Clock = std::chrono::steady_clock;
  double real_now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  const double idle_cap_s_;
  const Clock::time_point start_ = Clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  int in_flight_ = 0;
  double idle_since_ = 0;  // real seconds: when the last request in flight ended
  double skipped_ = 0;
  std::multiset<double> deadlines_;  // virtual seconds: the ends of the waits in progress
};

}  // namespace m3::loadgen
