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
    cudaEventDestroy(b.start);
    cudaEventDestroy(b.mid);
    cudaEventDestroy(b.end);
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

void KvBlockCopier::copy(const Tensor& pool, const Tensor& host, int64_t block_bytes,
                         std::span<const KvBlockCopy> to_host, std::span<const KvBlockCopy> to_device,
                         cudaStream_t compute) {
  check_kv_block_copies(pool, host, block_bytes, to_host, to_device);
  M3_CHECK(pool.device() == Device::kCuda && host.device() == Device::kCpu,
           "cuda backend: copy_kv_blocks between a device pool and a host tier");
  collect_finished();
  if (to_host.empty() && to_device.empty()) return;
  uint8_t* p = pool.data_as<uint8_t>();
  uint8_t* h = host.data_as<uint8_t>();
  check_cuda(cudaEventRecord(compute_ready_, compute), "KV copy: compute stream event");
  check_cuda(cudaStreamWaitEvent(stream_, compute_ready_, 0), "KV copy: wait for the compute stream");
  Batch b{timing_event(), timing_event(), timing_event()};
  check_cuda(cudaEventRecord(b.start, stream_), "KV copy: start event");
  for (const KvBlockCopy& c : to_host)
    check_cuda(cudaMemcpyAsync(h + c.host_slot * block_bytes, p + c.block * block_bytes, block_bytes,
                               cudaMemcpyDeviceToHost, stream_),
               "KV copy: block to host");
  check_cuda(cudaEventRecord(b.mid, stream_), "KV copy: event");
  for (const KvBlockCopy& c : to_device)
    check_cuda(cudaMemcpyAsync(p + c.block * block_bytes, h + c.host_slot * block_bytes, block_bytes,
                               cudaMemcpyHostToDevice, stream_),
               "KV copy: block to device");
  check_cuda(cudaEventRecord(b.end, stream_), "KV copy: end event");
  check_cuda(cudaStreamWaitEvent(compute, b.end, 0), "KV copy: compute waits for the copies");
  pending_.push_back(b);
}

void KvBlockCopier::collect_finished() const {
  while (!pending_.empty()) {
    const Batch b = pending_.front();
    const cudaError_t done = cudaEventQuery(b.end);
    if (done == cudaErrorNotReady) return;
    check_cuda(done, "KV copy: batch");
    float out_ms = 0, in_ms = 0;
    check_cuda(cudaEventElapsedTime(&out_ms, b.start, b.mid), "KV copy: time to host");
    check_cuda(cudaEventElapsedTime(&in_ms, b.mid, b.end), "KV copy: time to device");
    times_.to_host_s += out_ms * 1e-3;
    times_.to_device_s += in_ms * 1e-3;
    spare_.insert(spare_.end(), {b.start, b.mid, b.end});
    pending_.pop_front();
  }
}

KvCopyTimes KvBlockCopier::times() const {
  collect_finished();
  return times_;
}

}  // namespace m3::cuda
