#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace m3 {

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  for (int64_t d : shape) M3_CHECK(d >= 0, "negative dimension in shape {}", shape_string(shape));
  std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  M3_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded ? rounded : 64);
  Tensor t;
  t.data_ = p;
  t.dtype_ = dtype;
  t.device_ = Device::kCpu;
  t.shape_ = std::move(shape);
  t.owner_ = std::shared_ptr<void>(p, std::free);
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  M3_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_string(shape_),
           shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  M3_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
           "rows [{}, {}) out of range for shape {}", begin, end, shape_string(shape_));
  int64_t row_elems = shape_[0] ? numel() / shape_[0] : 0;
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + begin * row_elems * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_[0] = end - begin;
  return t;
}

}  // namespace m3
