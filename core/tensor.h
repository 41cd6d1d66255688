// Tensor: a typed, contiguous, row-major view of memory on one device, optionally owning it.
// Plain value type: copying a Tensor shares the memory (like a shared_ptr), never the bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace m3 {

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // New zero-filled host tensor: 64-byte aligned, and from 2 MiB on 2 MiB-aligned and advised to
  // transparent huge pages.
  static Tensor zeros(Shape shape, DType dtype);
  // The same without the zero fill (the caller writes every byte first).
  static Tensor uninitialized(Shape shape, DType dtype);
  // Wraps existing memory; `owner` keeps it alive (may be null for borrowed memory).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Same memory, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing memory.
  Tensor rows(int64_t begin, int64_t end) const;

  template <class T>
  std::span<T> span() const {
    return {data_as<T>(), static_cast<std::size_t>(numel())};
  }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
  std::shared_ptr<void> owner_;
};

}  // namespace m3
