// bf16 GEMMs through cuBLASLt: out [M, N] = x [M, K] W^T with W [N, K] row-major, bf16 in and out,
// fp32 accumulation (one rounding to bf16 at the end, as the CPU reference). Descriptors and the
// heuristic's algorithm are cached per shape; the workspace is allocated once, so calls allocate
// nothing and can be captured in a CUDA graph.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include <cuda_runtime_api.h>

namespace m3::cuda {

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // x_stride / out_stride in elements; all pointers on the device.
  void gemm_bf16(const uint16_t* x, int64_t x_stride, int m, const uint16_t* w, int n, int k, uint16_t* out,
                 int64_t out_stride, cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int64_t, int64_t, int>;
  Plan& plan_for(int m, int n, int k, int64_t x_stride, int64_t out_stride, int alignment);

  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace m3::cuda
