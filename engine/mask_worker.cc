#include "engine/mask_worker.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace m3 {

void fill_mask_job(MaskWorker::Job& job) {
  const size_t rows = job.drafts.size() + 1, width = job.words.size() / rows;
  DraftConstraintWalk walk(*job.constraint, job.remaining_tokens);
  try {
    for (size_t j = 0; j < rows; ++j) {
      const std::span<uint32_t> row = job.words.subspan(j * width, width);
      if (!walk.next_mask(row)) std::fill(row.begin(), row.end(), ~0u);
      if (j + 1 == rows) break;
      // The engine keeps only drafts the constraint accepts (EngineLoop::propose_drafts).
      if (!walk.accept(job.drafts[j])) fail("draft token {} does not continue the constrained text", job.drafts[j]);
    }
  } catch (const std::exception& e) {
    job.error = e.what();
    std::fill(job.words.begin(), job.words.end(), ~0u);  // the rows' tokens are discarded anyway
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
