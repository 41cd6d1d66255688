// KV blocks between the CUDA backend's pool and pinned host memory (the host tier of the prefix
// cache, --kv-offloading-size), on a copy stream of their own:
//   - a batch of copies first waits (an event) for every op queued on the compute stream so far,
//     so an offloaded block is read after the step that wrote it;
//   - the compute stream then waits (another event) for the copies the step needs: the blocks
//     evicted now (it overwrites them), then the restored ones (it reads them), and, when it reuses
//     a block saved ahead earlier, the end of that batch (KvBlockCopies::wait_for_batch; a batch
//     already collected as finished needs no wait). The saves ahead come last and overlap with it;
//   - the host never waits;
//   - each batch is timed with events, read once they have completed (no synchronisation).
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"

namespace m3::cuda {

class KvBlockCopier {
 public:
  KvBlockCopier();
  KvBlockCopier(const KvBlockCopier&) = delete;
  KvBlockCopier& operator=(const KvBlockCopier&) = delete;
  ~KvBlockCopier();

  // Pinned host memory (cudaHostAlloc, portable: pinned for every device of the process), freed
  // when the last Tensor copy goes.
  static Tensor alloc_host(int64_t bytes, std::string_view what);
  void copy(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies,
            cudaStream_t compute);
  KvCopyTimes times() const;

 private:
  struct Batch {
    uint64_t number;
    // Evicted blocks to the host between start and saved, restores between saved and needed (what
    // the step waits for), saves ahead between needed and end.
    cudaEvent_t start, saved, needed, end;
  };
  cudaEvent_t timing_event();
  // Adds the times of the batches that have completed and recycles their events.
  void collect_finished() const;

  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;

  mutable std::deque<Batch> pending_;
  mutable std::vector<cudaEvent_t> spare_;
  mutable KvCopyTimes times_;
};

}  // namespace m3::cuda
