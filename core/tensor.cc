#include "core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
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

namespace {

// Host tensors of 2 MiB and more start on a 2 MiB boundary and their whole 2 MiB pages are
// advised to transparent huge pages (not the partial last one, so no memory is added): the CPU
// backend reads the KV pool and the weights in slices scattered over hundreds of MiB (a block of
// the pool holds every layer), where 4 KiB pages cost a TLB miss (a nested page walk in a VM)
// every few KiB read.
void* host_alloc(std::size_t bytes, const Shape& shape) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t align = bytes >= kHuge ? kHuge : 64;
  void* p = nullptr;
  const int rc = ::posix_memalign(&p, align, std::max<std::size_t>(bytes, 1));
  M3_CHECK(rc == 0 && p != nullptr, "out of host memory allocating {} bytes for a tensor of shape {}", bytes,
           shape_string(shape));
#ifdef MADV_HUGEPAGE
  if (align == kHuge) ::madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  return p;
}

Tensor host_tensor(Shape shape, DType dtype, bool zero) {
  for (int64_t d : shape) M3_CHECK(d >= 0, "negative dimension in shape {}", shape_string(shape));
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* p = host_alloc(bytes, shape);
  if (zero) std::memset(p, 0, bytes);
  return Tensor::wrap(p, std::move(shape), dtype, Device::kCpu, std::shared_ptr<void>(p, std::free));
}

}  // namespace

Tensor Tensor::zeros(Shape shape, DType dtype) { return host_tensor(std::move(shape), dtype, true); }

Tensor Tensor::uninitialized(Shape shape, DType dtype) { return host_tensor(std::move(shape), dtype, false); }

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
