#include "parallel/communicator.h"

#include <cstdint>
#include <numeric>

#include "core/error.h"

namespace m3 {
namespace {

// "nccl all_gather (group tp, rank 1 of 4)": the start of every message, so a failure on one of
// many rank threads says which one.
std::string where(std::string_view what, const Communicator& comm) {
  return fmt::format("{} {} (group {}, rank {} of {})", comm.engine(), what, comm.group_name(), comm.rank(),
                     comm.size());
}

std::string describe(const Tensor& t) {
  return fmt::format("{} {} on {}", dtype_name(t.dtype()), shape_string(t.shape()), device_name(t.device()));
}

// An empty tensor may come without memory (a rank that receives no rows); any other needs some.
void check_memory(std::string_view what, const Communicator& comm, std::string_view name, const Tensor& t) {
  M3_CHECK(t.numel() == 0 || t.defined(), "{}: {} ({}) has no memory", where(what, comm), name, describe(t));
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// Either the same memory (in place, as all_reduce and broadcast run) or none shared: the engines'
// in-place variants of all_gather and reduce_scatter place `in` at a rank's offset in `out`, which
// the interface does not promise.
void check_placement(std::string_view what, const Communicator& comm, const Tensor& in, const Tensor& out) {
  const bool same = in.data() == out.data() && in.nbytes() == out.nbytes();
  M3_CHECK(same || !overlap(in, out), "{}: in ({}, {} bytes at {}) and out ({}, {} bytes at {}) overlap",
           where(what, comm), describe(in), in.nbytes(), in.data(), describe(out), out.nbytes(), out.data());
}

int64_t sum_rows(const std::vector<int64_t>& rows) { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }

void check_row_counts(const Communicator& comm, std::string_view name, const std::vector<int64_t>& rows,
                      const Tensor& t, std::string_view tensor) {
  M3_CHECK(static_cast<int>(rows.size()) == comm.size(), "{}: {} has {} entries, one per rank expected ({})",
           where("all_to_all", comm), name, rows.size(), comm.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    M3_CHECK(rows[r] >= 0, "{}: {}[{}] = {} is negative", where("all_to_all", comm), name, r, rows[r]);
  }
  M3_CHECK(sum_rows(rows) == t.dim(0), "{}: {} add up to {} rows but {} has {} ({})", where("all_to_all", comm), name,
           sum_rows(rows), tensor, t.dim(0), describe(t));
}

}  // namespace

void check_collective_shapes(std::string_view what, const Communicator& comm, const Tensor& in, const Tensor& out,
                             int64_t out_numel) {
  check_memory(what, comm, "in", in);
  check_memory(what, comm, "out", out);
  M3_CHECK(in.dtype() == out.dtype(), "{}: in is {} but out is {}", where(what, comm), describe(in), describe(out));
  M3_CHECK(in.device() == out.device(), "{}: in is {} but out is {}", where(what, comm), describe(in),
           describe(out));
  M3_CHECK(out.numel() == out_numel, "{}: out ({}) has {} elements, {} expected for in {} over {} ranks",
           where(what, comm), describe(out), out.numel(), out_numel, describe(in), comm.size());
  check_placement(what, comm, in, out);
}

void check_all_to_all_rows(const Communicator& comm, const Tensor& in, const std::vector<int64_t>& send_rows,
                           const Tensor& out, const std::vector<int64_t>& recv_rows) {
  constexpr std::string_view what = "all_to_all";
  M3_CHECK(in.ndim() == 2 && out.ndim() == 2, "{}: rows of 2-D tensors expected, in is {} and out is {}",
           where(what, comm), describe(in), describe(out));
  check_memory(what, comm, "in", in);
  check_memory(what, comm, "out", out);
  M3_CHECK(in.dtype() == out.dtype() && in.device() == out.device(), "{}: in is {} but out is {}", where(what, comm),
           describe(in), describe(out));
  M3_CHECK(in.dim(1) == out.dim(1), "{}: in has {} columns but out has {} (in {}, out {})", where(what, comm),
           in.dim(1), out.dim(1), describe(in), describe(out));
  check_row_counts(comm, "send_rows", send_rows, in, "in");
  check_row_counts(comm, "recv_rows", recv_rows, out, "out");
  // Rows go out while others come in: in place would overwrite rows not yet sent.
  M3_CHECK(!overlap(in, out), "{}: in ({}) and out ({}) overlap", where(what, comm), describe(in), describe(out));
}

}  // namespace m3
