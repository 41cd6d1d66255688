// Structured-output masks computed beside the forward pass: the engine hands the step's
// constrained rows to this worker before it runs the model, and the sampler waits for them
// (SampleBatch::masks_ready) only when it needs them, so the host work overlaps the GPU's.
// One thread, started on first use (an engine that never sees a constraint never starts it).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ops/token_constraint.h"

namespace m3 {

class MaskWorker {
 public:
  struct Job {
    TokenConstraint* constraint = nullptr;
    std::span<uint32_t> words;  // filled with the allowed tokens (all ones when none is excluded)
    int remaining_tokens = 0;
    std::string error;          // set when the constraint threw; the request fails with it
    // A speculative verification: words holds drafts.size() + 1 masks back to back, mask j the
    // tokens allowed after drafts [0, j) (the constraint walks through them, then rolls back).
    std::span<const int32_t> drafts;
  };

  MaskWorker() = default;
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Starts filling `jobs` (kept alive and untouched by the caller until wait() returns).
  void start(std::vector<Job>* jobs);
  // Blocks until the jobs of the last start() are done; returns at once when there are none.
  void wait();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Job>* jobs_ = nullptr;  // the batch in progress
  bool pending_ = false, stop_ = false;
  std::thread thread_;
};

// Runs one job (what the worker does; also the engine's path when it has no worker).
void fill_mask_job(MaskWorker::Job& job);

}  // namespace m3
