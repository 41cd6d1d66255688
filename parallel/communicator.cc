#include "parallel/communicator.h"

#include <numeric>

#include "core/error.h"

namespace m3 {

void check_collective_shapes(std::string_view what, const Communicator& comm, const Tensor& in, const Tensor& out,
                             int64_t out_numel) {
  M3_CHECK(in.defined() && out.defined(), "{} in group '{}': undefined tensor", what, comm.group_name());
  M3_CHECK(in.dtype() == out.dtype(), "{} in group '{}': input {} and output {} differ in dtype", what,
           comm.group_name(), dtype_name(in.dtype()), dtype_name(out.dtype()));
  M3_CHECK(in.device() == out.device(), "{} in group '{}': input and output on different devices", what,
           comm.group_name());
  M3_CHECK(out.numel() == out_numel, "{} in group '{}' of {} ranks: output has {} elements, needs {} (input {})",
           what, comm.group_name(), comm.size(), out.numel(), out_numel, in.numel());
}

void check_all_to_all_rows(const Communicator& comm, const Tensor& in, const std::vector<int64_t>& send_rows,
                           const Tensor& out, const std::vector<int64_t>& recv_rows) {
  const auto& g = comm.group_name();
  M3_CHECK(static_cast<int>(send_rows.size()) == comm.size() && static_cast<int>(recv_rows.size()) == comm.size(),
           "all_to_all in group '{}': {} send and {} receive counts for {} ranks", g, send_rows.size(),
           recv_rows.size(), comm.size());
  M3_CHECK(in.dtype() == out.dtype() && in.device() == out.device(),
           "all_to_all in group '{}': input and output differ in dtype or device", g);
  M3_CHECK(in.ndim() >= 1 && out.ndim() >= 1, "all_to_all in group '{}': tensors need a row dimension", g);
  const Shape in_row(in.shape().begin() + 1, in.shape().end()), out_row(out.shape().begin() + 1, out.shape().end());
  const int64_t in_cols = shape_numel(in_row), out_cols = shape_numel(out_row);
  M3_CHECK(in_cols == out_cols,
           "all_to_all in group '{}': input rows of {} elements, output rows of {}", g, in_cols, out_cols);
  for (int r = 0; r < comm.size(); ++r)
    M3_CHECK(send_rows[r] >= 0 && recv_rows[r] >= 0, "all_to_all in group '{}': negative row count for rank {}", g, r);
  const int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  M3_CHECK(sent <= in.dim(0), "all_to_all in group '{}': sends {} rows, input has {}", g, sent, in.dim(0));
  M3_CHECK(received <= out.dim(0), "all_to_all in group '{}': receives {} rows, output has {}", g, received,
           out.dim(0));
}

}  // namespace m3
