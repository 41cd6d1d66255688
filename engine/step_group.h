// StepGroup: the data-parallel lanes of one EngineCore step together. Their models share the
// routed experts (data-parallel attention, model/minimax_m3.h), so every MoE layer of a step is an
// exchange every lane must join: a lane that runs a step enters the group, and a lane with nothing
// to run is woken to enter with an idle step. Steps are numbered implicitly: a lane's n-th enter()
// is step n.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace m3 {

class StepGroup {
 public:
  // wake_lanes is called (without the group's lock) when a lane enters a step, so idle lanes
  // re-check waiting_for().
  StepGroup(int lanes, std::function<void()> wake_lanes);

  int size() const { return static_cast<int>(entered_.size()); }
  // Blocks until every lane has entered this step. Throws m3::Error after close().
  void enter(int lane);
  // A peer has entered a step this lane has not.
  bool waiting_for(int lane) const;
  // Releases every waiting lane with an error (the engine is stopping); later enters throw too.
  void close();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> wake_lanes_;
  uint64_t step_ = 0;     // the step lanes are entering now
  int arrived_ = 0;       // lanes that entered it
  std::vector<uint64_t> entered_;  // per lane: 1 + the last step it entered (0: none)
  bool closed_ = false;
};

}  // namespace m3
