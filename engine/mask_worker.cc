#include "engine/mask_worker.h"

#include <algorithm>
#include <exception>

namespace m3 {

void fill_mask_job(MaskWorker::Job& job) {
  try {
    if (!job.constraint->fill_allowed(job.words, job.remaining_tokens)) {
      std::fill(job.words.begin(), job.words.end(), ~0u);
    }
  } catch (const std::exception& e) {
    job.error = e.what();
    std::fill(job.words.begin(), job.words.end(), ~0u);  // the row's token is discarded anyway
  }
}

MaskWorker::~MaskWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MaskWorker::start(std::vector<Job>* jobs) {
  {
    std::lock_guard lock(mu_);
    jobs_ = jobs;
    pending_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
}

void MaskWorker::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !pending_; });
}

void MaskWorker::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stop_; });
    if (stop_) return;
    std::vector<Job>* jobs = jobs_;
    lock.unlock();
    for (Job& job : *jobs) fill_mask_job(job);
    lock.lock();
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace m3
