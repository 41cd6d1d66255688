#include "parallel/rank_workers.h"

#include "core/error.h"

namespace m3 {

RankWorkers::RankWorkers(int num_ranks, std::function<void(int)> on_start) {
  M3_CHECK(num_ranks >= 1, "RankWorkers needs at least one rank, got {}", num_ranks);
  errors_.resize(num_ranks);
  pending_ = num_ranks;  // the start hooks are the first job
  for (int r = 0; r < num_ranks; ++r) threads_.emplace_back([this, r, on_start] { loop(r, on_start); });
  std::exception_ptr first;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    for (auto& e : errors_)
      if (e && !first) first = e;
  }
  if (first) {
    stop_threads();
    std::rethrow_exception(first);
  }
}

RankWorkers::~RankWorkers() { stop_threads(); }

void RankWorkers::stop_threads() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void RankWorkers::run(const std::function<void(int)>& job) {
  std::exception_ptr first;
  {
    std::unique_lock lock(mutex_);
    M3_CHECK(pending_ == 0 && !stop_, "RankWorkers::run called while a job runs or after stop");
    job_ = &job;
    pending_ = size();
    for (auto& e : errors_) e = nullptr;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (auto& e : errors_)
      if (e && !first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

void RankWorkers::loop(int rank, const std::function<void(int)>& on_start) {
  auto finish = [&](std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    errors_[rank] = error;
    if (--pending_ == 0) done_.notify_all();
  };
  try {
    if (on_start) on_start(rank);
    finish(nullptr);
  } catch (...) {
    finish(std::current_exception());
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(rank);
      finish(nullptr);
    } catch (...) {
      finish(std::current_exception());
    }
  }
}

}  // namespace m3
