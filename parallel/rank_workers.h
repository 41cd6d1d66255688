// RankWorkers: one persistent thread per rank of this process, running the same job on every
// rank and waiting for all of them (a rank's thread is where its device is bound and where its
// collectives are issued, so a job that blocks in a collective waits for its peers there).
//
// An exception on any rank is rethrown by run() (the lowest rank's first), after every rank has
// returned: the collectives time out (Gloo) or abort (NCCL) rather than hang, so a failing rank
// stops the whole group with its own message.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

class RankWorkers {
 public:
  // `on_start(rank)` runs first on each rank's thread (e.g. cudaSetDevice); its errors surface
  // from the constructor.
  explicit RankWorkers(int num_ranks, std::function<void(int)> on_start = {});
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs job(rank) on every rank's thread concurrently; returns when all are done. Not reentrant.
  void run(const std::function<void(int)>& job);

 private:
  void loop(int rank, const std::function<void(int)>& on_start);
  void stop_threads();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped per job; a thread runs each generation once
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace m3
