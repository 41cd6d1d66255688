#include "engine/step_group.h"

#include "core/error.h"

namespace m3 {

StepGroup::StepGroup(int lanes, std::function<void()> wake_lanes)
    : wake_lanes_(std::move(wake_lanes)), entered_(lanes, 0) {
  M3_CHECK(lanes >= 1, "a step group needs at least one lane, got {}", lanes);
}

void StepGroup::enter(int lane) {
  uint64_t mine;
  {
    std::lock_guard lock(mu_);
    M3_CHECK(!closed_, "lane {}: the data-parallel lanes are stopping", lane);
    M3_CHECK(entered_[lane] != step_ + 1, "lane {} entered step {} twice", lane, step_);
    mine = step_;
    entered_[lane] = step_ + 1;
    if (++arrived_ == size()) {
      ++step_;
      arrived_ = 0;
      cv_.notify_all();
      return;
    }
  }
  if (wake_lanes_) wake_lanes_();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return step_ != mine || closed_; });
  M3_CHECK(step_ != mine, "lane {}: the data-parallel lanes stopped during step {}", lane, mine);
}

bool StepGroup::waiting_for(int lane) const {
  std::lock_guard lock(mu_);
  return !closed_ && arrived_ > 0 && entered_[lane] != step_ + 1;
}

void StepGroup::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

}  // namespace m3
