#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace m3 {
namespace {

static_assert(NcclUniqueId::kBytes == sizeof(ncclUniqueId), "NcclUniqueId must hold ncclUniqueId's bytes");

std::string nccl_reason(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{} ({}){}{}", ncclGetErrorString(result), static_cast<int>(result),
                     last && *last ? ": " : "", last ? last : "");
}

std::string cuda_reason(cudaError_t err) {
  return fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
}

// `where` names the collective for the error.
ncclDataType_t reduce_type(DType dtype, const std::string& where) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    default: fail("{}: reductions take F32, BF16 or I32, not {}", where, dtype_name(dtype));
  }
}

ncclRedOp_t reduce_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream, std::string group, int* word)
      : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream), group_(std::move(group)),
        barrier_word_(word) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view engine() const override { return "nccl"; }
  const std::string& group_name() const override { return group_; }
  int cuda_device() const override { return device_; }
  void* stream() const override { return stream_; }

  void all_reduce(Tensor x, ReduceOp op) override;
  void all_gather(const Tensor& in, Tensor out) override;
  void reduce_scatter(const Tensor& in, Tensor out) override;
  void all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor out,
                  const std::vector<int64_t>& recv_rows) override;
  void broadcast(Tensor x, int root) override;
  void barrier() override;
  void poll_error() override;
  void abort() override;

 private:
  std::string where(std::string_view what) const {
    return fmt::format("nccl {} (group {}, rank {} of {}, cuda device {})", what, group_, rank_, size_, device_);
  }
  void check(std::string_view what, ncclResult_t result);
  void check_cuda(std::string_view what, cudaError_t err);
  void check_live(std::string_view what) const;
  void check_device_tensor(std::string_view what, const Tensor& t) const;

  ncclComm_t comm_;
  const int rank_;
  const int size_;
  const int device_;
  cudaStream_t stream_;
  const std::string group_;
  int* barrier_word_;  // the barrier's all-reduce: one device word of zero, whose sum stays zero
  // Set by a failed call or poll, read by the destructor: then abort, not destroy. Atomic since
  // poll_error() and abort() may run on a watchdog thread.
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
};

void NcclComm::check(std::string_view what, ncclResult_t result) {
  if (result == ncclSuccess) return;
  failed_ = true;
  fail("{}: {}", where(what), nccl_reason(result, comm_));
}

void NcclComm::check_cuda(std::string_view what, cudaError_t err) {
  if (err == cudaSuccess) return;
  failed_ = true;
  fail("{}: {}", where(what), cuda_reason(err));
}

void NcclComm::check_live(std::string_view what) const {
  M3_CHECK(!aborted_, "{}: the communicator was aborted after an error", where(what));
}

void NcclComm::check_device_tensor(std::string_view what, const Tensor& t) const {
  M3_CHECK(t.device() == Device::kCuda, "{}: a CUDA tensor expected, got {} {} on {}", where(what),
           dtype_name(t.dtype()), shape_string(t.shape()), device_name(t.device()));
}

void NcclComm::all_reduce(Tensor x, ReduceOp op) {
  constexpr std::string_view what = "all_reduce";
  check_live(what);
  check_device_tensor(what, x);
  check_collective_shapes(what, *this, x, x, x.numel());
  const ncclDataType_t type = reduce_type(x.dtype(), where(what));
  check(what, ncclAllReduce(x.data(), x.data(), x.numel(), type, reduce_op(op), comm_, stream_));
}

// The data-movement collectives count bytes (ncclUint8), so any dtype moves.
void NcclComm::all_gather(const Tensor& in, Tensor out) {
  constexpr std::string_view what = "all_gather";
  check_live(what);
  check_device_tensor(what, in);
  check_device_tensor(what, out);
  check_collective_shapes(what, *this, in, out, in.numel() * size_);
  check(what, ncclAllGather(in.data(), out.data(), in.nbytes(), ncclUint8, comm_, stream_));
}

void NcclComm::reduce_scatter(const Tensor& in, Tensor out) {
  constexpr std::string_view what = "reduce_scatter";
  check_live(what);
  check_device_tensor(what, in);
  check_device_tensor(what, out);
  M3_CHECK(in.numel() % size_ == 0, "{}: in ({} {}, {} elements) does not split into {} equal parts", where(what),
           dtype_name(in.dtype()), shape_string(in.shape()), in.numel(), size_);
  check_collective_shapes(what, *this, in, out, in.numel() / size_);
  const ncclDataType_t type = reduce_type(in.dtype(), where(what));
  check(what, ncclReduceScatter(in.data(), out.data(), out.numel(), type, ncclSum, comm_, stream_));
}

// The rank's own rows are a device copy; the others one NCCL group of a send and a receive per
// peer, so NCCL schedules them together and no pair of ranks waits on the other's order. Empty
// transfers are left out: both ends know the count (recv_rows[r] = r's send_rows[rank]).
void NcclComm::all_to_all(const Tensor& in, const std::vector<int64_t>& send_rows, Tensor out,
                          const std::vector<int64_t>& recv_rows) {
  constexpr std::string_view what = "all_to_all";
  check_live(what);
  check_device_tensor(what, in);
  check_device_tensor(what, out);
  check_all_to_all_rows(*this, in, send_rows, out, recv_rows);
  M3_CHECK(send_rows[rank_] == recv_rows[rank_], "{}: send_rows[{}] = {} rows to itself but recv_rows[{}] = {}",
           where(what), rank_, send_rows[rank_], rank_, recv_rows[rank_]);
  const std::size_t row_bytes = static_cast<std::size_t>(in.dim(1)) * dtype_size(in.dtype());
  std::vector<std::size_t> send_at(size_ + 1, 0), recv_at(size_ + 1, 0);  // byte offsets, rank order
  for (int peer = 0; peer < size_; ++peer) {
    send_at[peer + 1] = send_at[peer] + static_cast<std::size_t>(send_rows[peer]) * row_bytes;
    recv_at[peer + 1] = recv_at[peer] + static_cast<std::size_t>(recv_rows[peer]) * row_bytes;
  }
  auto* src = static_cast<const char*>(in.data());
  auto* dst = static_cast<char*>(out.data());
  if (const std::size_t own = send_at[rank_ + 1] - send_at[rank_]) {
    check_cuda("all_to_all (the rank's own rows)",
               cudaMemcpyAsync(dst + recv_at[rank_], src + send_at[rank_], own, cudaMemcpyDeviceToDevice, stream_));
  }
  check(what, ncclGroupStart());
  ncclResult_t result = ncclSuccess;
  for (int peer = 0; peer < size_ && result == ncclSuccess; ++peer) {
    if (peer == rank_) continue;
    const std::size_t send_bytes = send_at[peer + 1] - send_at[peer];
    const std::size_t recv_bytes = recv_at[peer + 1] - recv_at[peer];
    if (send_bytes) result = ncclSend(src + send_at[peer], send_bytes, ncclUint8, peer, comm_, stream_);
    if (recv_bytes && result == ncclSuccess) {
      result = ncclRecv(dst + recv_at[peer], recv_bytes, ncclUint8, peer, comm_, stream_);
    }
  }
  // The group is closed whatever happened inside it; the first failure is the one reported.
  const ncclResult_t end = ncclGroupEnd();
  check(what, result != ncclSuccess ? result : end);
}

void NcclComm::broadcast(Tensor x, int root) {
  constexpr std::string_view what = "broadcast";
  check_live(what);
  check_device_tensor(what, x);
  M3_CHECK(root >= 0 && root < size_, "{}: root {} is not a rank of the group (0..{})", where(what), root, size_ - 1);
  check_collective_shapes(what, *this, x, x, x.numel());
  check(what, ncclBroadcast(x.data(), x.data(), x.nbytes(), ncclUint8, root, comm_, stream_));
}

void NcclComm::barrier() {
  check_live("barrier");
  check("barrier", ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_));
}

void NcclComm::poll_error() {
  if (aborted_) fail("{}: the communicator was aborted", where("poll_error"));
  ncclResult_t async = ncclSuccess;
  check("poll_error (ncclCommGetAsyncError)", ncclCommGetAsyncError(comm_, &async));
  // ncclInProgress: a non-blocking call still under way, which a blocking communicator never has.
  if (async != ncclSuccess && async != ncclInProgress) {
    failed_ = true;
    fail("{}: the group failed: {}", where("poll_error"), nccl_reason(async, comm_));
  }
}

void NcclComm::abort() {
  if (aborted_.exchange(true)) return;
  failed_ = true;
  const ncclResult_t result = ncclCommAbort(comm_);
  if (result != ncclSuccess) {
    M3_LOG_ERROR("{}: ncclCommAbort failed: {}", where("abort"), nccl_reason(result, nullptr));
  }
}

NcclComm::~NcclComm() {
  if (failed_) {
    // After a failure ncclCommDestroy would wait for peers that may be gone. The barrier word is
    // left allocated: cudaFree synchronises the device, where another group's kernels may be
    // stuck on the same lost peer.
    abort();
    return;
  }
  // Orderly: finalize waits for this rank's outstanding collectives, then the resources go.
  int current = -1;
  cudaGetDevice(&current);
  cudaSetDevice(device_);
  const ncclResult_t result = ncclCommDestroy(comm_);
  if (result != ncclSuccess) {
    M3_LOG_ERROR("{}: ncclCommDestroy failed: {}", where("destroy"), nccl_reason(result, nullptr));
  }
  const cudaError_t err = cudaFree(barrier_word_);
  if (err != cudaSuccess) M3_LOG_ERROR("{}: cudaFree: {}", where("destroy"), cuda_reason(err));
  if (current >= 0) cudaSetDevice(current);
}

}  // namespace

NcclUniqueId make_nccl_unique_id() {
  ncclUniqueId raw;
  const ncclResult_t result = ncclGetUniqueId(&raw);
  M3_CHECK(result == ncclSuccess, "nccl: ncclGetUniqueId failed: {}", nccl_reason(result, nullptr));
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), raw.internal, sizeof raw.internal);
  return id;
}

std::unique_ptr<NcclCommunicator> connect_nccl(const NcclUniqueId& id, int rank, int size, int cuda_device,
                                               void* stream, std::string group_name) {
  const auto where = [&] {
    return fmt::format("nccl connect (group {}, rank {} of {}, cuda device {})", group_name, rank, size, cuda_device);
  };
  M3_CHECK(size >= 1 && rank >= 0 && rank < size, "{}: rank must be in 0..size-1 and size at least 1", where());
  cudaError_t err = cudaSetDevice(cuda_device);
  M3_CHECK(err == cudaSuccess, "{}: cudaSetDevice: {}", where(), cuda_reason(err));
  int* word = nullptr;
  err = cudaMalloc(reinterpret_cast<void**>(&word), sizeof(int));
  M3_CHECK(err == cudaSuccess, "{}: cudaMalloc of the barrier word: {}", where(), cuda_reason(err));
  err = cudaMemset(word, 0, sizeof(int));
  if (err != cudaSuccess) {
    cudaFree(word);
    fail("{}: cudaMemset of the barrier word: {}", where(), cuda_reason(err));
  }

  ncclUniqueId raw;
  std::memcpy(raw.internal, id.bytes.data(), sizeof raw.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = group_name.c_str();  // NCCL's own logs then name the group
  // Every rank of the group calls this concurrently, each on its own thread: it returns once all
  // have joined. No ncclGroupStart around it: grouping is for one thread initialising several
  // ranks, and a group of one rank's init is only a slower path to the same wait.
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, size, raw, rank, &config);
  if (result != ncclSuccess) {
    const std::string reason = nccl_reason(result, comm);
    if (comm) ncclCommAbort(comm);
    cudaFree(word);
    fail("{}: ncclCommInitRankConfig: {}", where(), reason);
  }
  return std::make_unique<NcclComm>(comm, rank, size, cuda_device, static_cast<cudaStream_t>(stream),
                                    std::move(group_name), word);
}

}  // namespace m3
