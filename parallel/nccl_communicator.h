// The NCCL Communicator (parallel/communicator.h): CUDA tensors of one device, every collective
// enqueued on the stream the communicator was made with and never waited for on the host, so a
// CUDA graph can capture them. Library m3_parallel_nccl, built with the CUDA backend; this header
// names no NCCL or CUDA type, so the layers above include it without the toolkit's headers.
//
// Making a group of `size` ranks: one process creates an id (make_nccl_unique_id), every rank gets
// its bytes (in one process: a copy; across hosts: sent as the 128 bytes), and every rank calls
// connect_nccl with it at the same time, each on its own thread: NCCL's init returns only once the
// whole group has joined, so ranks connected one after another from one thread wait forever.
//
// Failure: a lost peer leaves the collective's kernels spinning on the GPU while the host call has
// long returned. Whoever waits for the stream (the runner) polls poll_error() meanwhile, and calls
// abort() when another rank of the group has failed; a communicator that saw an error is aborted,
// not destroyed, since NCCL's orderly teardown waits for the peers.
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace m3 {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES = 128): the rendezvous address of one group, made
// once and handed to every rank, between hosts as these bytes.
struct NcclUniqueId {
  static constexpr std::size_t kBytes = 128;
  std::array<std::byte, kBytes> bytes{};
};

// A fresh id (ncclGetUniqueId; it opens the bootstrap listener of this process).
NcclUniqueId make_nccl_unique_id();

class NcclCommunicator : public Communicator {
 public:
  // Throws m3::Error (naming the group and the rank, with NCCL's reason) when NCCL has recorded an
  // asynchronous failure on this communicator (ncclCommGetAsyncError: a lost peer, a network or
  // proxy error); returns quietly while all is well. Cheap: the runner calls it in its wait for the
  // stream (cudaStreamQuery in a loop, not cudaStreamSynchronize, which would wait forever), also
  // from another thread than the one that enqueues.
  virtual void poll_error() = 0;
  // Ends the communicator now (ncclCommAbort): its kernels still in flight stop, later collectives
  // and polls throw. For the runner when another rank of the group failed and this one would wait
  // for it. Not concurrently with another call on this communicator.
  virtual void abort() = 0;
  virtual int cuda_device() const = 0;
  virtual void* stream() const = 0;  // the cudaStream_t the collectives are enqueued on
};

// Rank `rank` of a group of `size` made from `id`, on CUDA device `cuda_device` (made current on the
// calling thread), its collectives on `stream` (a cudaStream_t; nullptr: the default stream, which
// CUDA graphs cannot capture). Blocks until all `size` ranks have called it (see above). The
// communicator is blocking (ncclConfig_t blocking = 1): every call returns once enqueued.
std::unique_ptr<NcclCommunicator> connect_nccl(const NcclUniqueId& id, int rank, int size, int cuda_device,
                                               void* stream, std::string group_name);

}  // namespace m3
