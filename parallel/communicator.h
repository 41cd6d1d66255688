// Communicator: the collectives the parallel layouts need, over one group of ranks, on tensors of
// one device. Two implementations, each on an existing engine:
//  - NCCL (parallel/nccl_communicator.h): CUDA tensors, enqueued on the stream it was made with,
//    asynchronous and capturable in CUDA graphs (no host synchronisation inside);
//  - Gloo (parallel/gloo_communicator.h): host tensors, blocking, so the CPU backend runs the same
//    parallel code as the GPUs and CI tests it.
//
// Every rank of the group calls the same collectives in the same order with the same shapes (the
// layout decides them, so they agree by construction). A collective that fails (a peer lost, a
// timeout, an NCCL error) throws m3::Error naming the collective and the group; the ranks of an
// in-process group then stop together (parallel/rank_workers.h).
//
// Element types: reductions take F32 and I32 everywhere, BF16 on NCCL and I64 on Gloo; the
// data-movement collectives (all_gather, all_to_all, broadcast) move bytes of any dtype.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace m3 {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "nccl" or "gloo", and the group's role ("tp", "ep", ...), for logs and errors.
  virtual std::string_view engine() const = 0;
  virtual const std::string& group_name() const = 0;

  // x = op over the ranks of x, in place.
  virtual void all_reduce(Tensor x, ReduceOp op = ReduceOp::kSum) = 0;
  // out (size() * in.numel() elements, contiguous) = the ranks' `in`, rank 0 first. out must not
  // overlap in.
  virtual void all_gather(const Tensor& in, Tensor out) = 0;
  // out (in.numel() / size() elements) = the sum over ranks of their in's part rank().
  virtual void reduce_scatter(const Tensor& in, Tensor out) = 0;
  // Uneven all-to-all over rows (dim 0) of 2-D tensors with equal column counts: rows
  // [sum send_rows[0..r), + send_rows[r]) of `in` go to rank r; `out` receives recv_rows[r] rows
  // from rank r, in rank order. recv_rows[r] must equal rank r's send_rows[rank()].
  virtual void all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor out,
                          const std::vector<int64_t>& recv_rows) = 0;
  // x = root's x on every rank.
  virtual void broadcast(Tensor x, int root) = 0;
  // Returns when every rank has called it (Gloo: blocks; NCCL: an all-reduce of one word on the
  // stream, so later work on the stream waits for every rank).
  virtual void barrier() = 0;
};

// The checks every implementation makes before moving bytes; m3::Error names the collective.
void check_collective_shapes(std::string_view what, const Communicator& comm, const Tensor& in,
                             const Tensor& out, int64_t out_numel);
void check_all_to_all_rows(const Communicator& comm, const Tensor& in, const std::vector<int64_t>& send_rows,
                           const Tensor& out, const std::vector<int64_t>& recv_rows);

}  // namespace m3
