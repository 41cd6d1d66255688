// Device memory: tensors, growable scratch buffers, pinned host staging.
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3 {
namespace cuda {

Tensor device_tensor(Shape shape, DType dtype, const char* what) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* ptr = nullptr;
  const cudaError_t e = cudaMalloc(&ptr, bytes ? bytes : 16);
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail("out of GPU memory allocating {} ({} {}, {:.1f} MiB; {:.1f} MiB free of {:.1f} MiB): {}", what,
         dtype_name(dtype), shape_string(shape), bytes / 1048576.0, free_bytes / 1048576.0, total / 1048576.0,
         cudaGetErrorString(e));
  }
  check_cuda(cudaMemset(ptr, 0, bytes ? bytes : 16), what);
  return Tensor::wrap(ptr, std::move(shape), dtype, Device::kCuda, std::shared_ptr<void>(ptr, [](void* p) {
                        cudaFree(p);
                      }));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

bool DeviceBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return false;
  if (moves_) ++*moves_;
  if (ptr_) check_cuda(cudaFree(ptr_), what);
  ptr_ = nullptr;
  bytes_ = 0;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  M3_CHECK(e == cudaSuccess, "out of GPU memory growing {} to {:.1f} MiB: {}", what, bytes / 1048576.0,
           cudaGetErrorString(e));
  bytes_ = bytes;
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

void PinnedBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return;
  if (ptr_) check_cuda(cudaFreeHost(ptr_), what);
  ptr_ = nullptr;
  bytes_ = 0;
  check_cuda(cudaMallocHost(&ptr_, bytes), what);
  bytes_ = bytes;
}

}  // namespace cuda

}  // namespace m3
