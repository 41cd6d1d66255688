#include "tests/kernels_cuda/bench_weights.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3::test {

using cuda::check_cuda;

LinearWeight constant_weight(int64_t out, int64_t in, WeightFormat format) {
  constexpr float kNvfp4Divisor = 21504.0f;
  LinearWeight w;
  w.name = "bench weight";
  w.out_features = out;
  w.in_features = in;
  w.format = format;
  if (format == WeightFormat::kNvfp4) {
    w.weight = cuda::device_tensor({out, in / 2}, DType::kU8, "bench nvfp4 weight");
    w.scale = cuda::device_tensor({out, in / 16}, DType::kF8E4M3, "bench nvfp4 scale");
    check_cuda(cudaMemset(w.weight.data(), 0x5a, w.weight.nbytes()), "bench fill");
    check_cuda(cudaMemset(w.scale.data(), 0x30, w.scale.nbytes()), "bench fill");
    w.global_divisor = kNvfp4Divisor;
    w.global_scale = 1.0f / kNvfp4Divisor;
  } else {
    w.weight = cuda::device_tensor({out, in}, DType::kF8E4M3, "bench mxfp8 weight");
    w.scale = cuda::device_tensor({out, in / 32}, DType::kU8, "bench mxfp8 scale");
    check_cuda(cudaMemset(w.weight.data(), 0x38, w.weight.nbytes()), "bench fill");
    check_cuda(cudaMemset(w.scale.data(), 120, w.scale.nbytes()), "bench fill");
  }
  return w;
}

cuda::detail::WeightView view_of(const LinearWeight& w) {
  cuda::detail::WeightView v;
  v.data = w.weight.data_as<const uint8_t>();
  v.scale = w.scale.data_as<const uint8_t>();
  v.row_bytes = w.weight.dim(1);
  v.scale_stride = w.scale.dim(1);
  if (w.format == WeightFormat::kNvfp4) {
    v.kind = cuda::detail::WeightKind::kNvfp4;
    v.out_div = w.global_divisor;
  } else {
    v.kind = cuda::detail::WeightKind::kMxfp8;
  }
  return v;
}

}  // namespace m3::test
