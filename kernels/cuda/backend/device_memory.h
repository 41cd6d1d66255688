// Device memory for the CUDA backend: owning device Tensors (freed when the last copy goes),
// grow-only scratch buffers, pinned staging memory, and the error check of runtime calls.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "core/tensor.h"

namespace m3::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  M3_CHECK(e == cudaSuccess, "CUDA error in {}: {} ({})", what, cudaGetErrorString(e), int(e));
}

// A zero-filled device tensor that owns its memory. `what` names it in out-of-memory errors.
Tensor device_tensor(Shape shape, DType dtype, const char* what);

// Grow-only device allocation; reserve() returns true when the buffer moved, and then also counts
// the move in `moves` when given (the owner's counter: a recorded CUDA graph holds the buffer's
// address and must be dropped once it moves, cuda_graphs.h).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t* moves = nullptr) : moves_(moves) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  bool reserve(size_t bytes, const char* what);
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  int64_t* moves_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  void reserve(size_t bytes, const char* what);
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace m3::cuda
