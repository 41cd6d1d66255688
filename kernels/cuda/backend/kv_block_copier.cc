#include "kernels/cuda/backend/kv_block_copier.h"

#include <string>

#include "kernels/cuda/backend/device_memory.h"

namespace m3::cuda {

KvBlockCopier::KvBlockCopier() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "KV copy stream");
  check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "KV copy event");

}

KvBlockCopier::~KvBlockCopier() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (compute_ready_) cudaEventDestroy(compute_ready_);

  for (const Batch& b : pending_) {
    for (cudaEvent_t e : {b.start, b.saved, b.needed, b.end}) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

Tensor KvBlockCopier::alloc_host(int64_t bytes, std::string_view what) {
  M3_CHECK(bytes > 0, "cuda backend: {} of {} bytes", what, bytes);
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
  M3_CHECK(e == cudaSuccess, "cuda backend: cannot pin {:.2f} GiB of host memory for {}: {}",
           bytes / double(1ull << 30), what, cudaGetErrorString(e));
  std::shared_ptr<void> owner(p, [](void* q) { cudaFreeHost(q); });
  return Tensor::wrap(p, {bytes}, DType::kU8, Device::kCpu, std::move(owner));
}

cudaEvent_t KvBlockCopier::timing_event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "KV copy timing event");
  return e;
}

void KvBlockCopier::copy(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies,
                         cudaStream_t compute) {
  check_kv_block_copies(pool, host, block_bytes, copies);
  M3_CHECK(pool.device() == Device::kCuda && host.device() == Device::kCpu,
           "cuda backend: copy_kv_blocks between a device pool and a host tier");
  collect_finished();
  if (copies.wait_for_batch > 0) {
    for (const Batch& b : pending_) {
      if (b.number == copies.wait_for_batch)
        check_cuda(cudaStreamWaitEvent(compute, b.end, 0), "KV copy: compute waits for an earlier batch");
    }
  }
  if (copies.to_host.empty() && copies.to_device.empty() && copies.to_host_ahead.empty()) return;
  uint8_t* p = pool.data_as<uint8_t>();
  uint8_t* h = host.data_as<uint8_t>();
  const auto save = [&](const std::vector<KvBlockCopy>& list) {
    for (const KvBlockCopy& c : list)
      check_cuda(cudaMemcpyAsync(h + c.host_slot * block_bytes, p + c.block * block_bytes, block_bytes,
                                 cudaMemcpyDeviceToHost, stream_),
                 "KV copy: block to host");
  };
  check_cuda(cudaEventRecord(compute_ready_, compute), "KV copy: compute stream event");
  check_cuda(cudaStreamWaitEvent(stream_, compute_ready_, 0), "KV copy: wait for the compute stream");
  const Batch b{copies.batch, timing_event(), timing_event(), timing_event(), timing_event()};
  check_cuda(cudaEventRecord(b.start, stream_), "KV copy: start event");
  save(copies.to_host);
  check_cuda(cudaEventRecord(b.saved, stream_), "KV copy: event");
  for (const KvBlockCopy& c : copies.to_device)
    check_cuda(cudaMemcpyAsync(p + c.block * block_bytes, h + c.host_slot * block_bytes, block_bytes,
                               cudaMemcpyHostToDevice, stream_),
               "KV copy: block to device");
  check_cuda(cudaEventRecord(b.needed, stream_), "KV copy: event");
  if (!copies.to_host.empty() || !copies.to_device.empty())
    check_cuda(cudaStreamWaitEvent(compute, b.needed, 0), "KV copy: compute waits for the copies");
  save(copies.to_host_ahead);
  check_cuda(cudaEventRecord(b.end, stream_), "KV copy: end event");
  pending_.push_back(b);
}

void KvBlockCopier::collect_finished() const {
  while (!pending_.empty()) {
    const Batch b = pending_.front();
    const cudaError_t done = cudaEventQuery(b.end);
    if (done == cudaErrorNotReady) return;
    check_cuda(done, "KV copy: batch");
    float saved_ms = 0, restored_ms = 0, ahead_ms = 0;
    check_cuda(cudaEventElapsedTime(&saved_ms, b.start, b.saved), "KV copy: time to host");
    check_cuda(cudaEventElapsedTime(&restored_ms, b.saved, b.needed), "KV copy: time to device");
    check_cuda(cudaEventElapsedTime(&ahead_ms, b.needed, b.end), "KV copy: time to host ahead");
    times_.to_host_s += (saved_ms + ahead_ms) * 1e-3;
    times_.to_device_s += restored_ms * 1e-3;
    spare_.insert(spare_.end(), {b.start, b.saved, b.needed, b.end});
    pending_.pop_front();
  }
}

KvCopyTimes KvBlockCopier::times() const {
  collect_finished();
  return times_;
}

}  // namespace m3::cuda
