#include "kernels/cuda/backend/cublas_gemm.h"

#include <cublasLt.h>

#include "core/error.h"

namespace m3::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

void check_lt(cublasStatus_t s, const char* what) {
  M3_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in {}: status {}", what, int(s));
}

}  // namespace

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

CublasLtGemm::CublasLtGemm() {
  cublasLtHandle_t h = nullptr;
  check_lt(cublasLtCreate(&h), "cublasLtCreate");
  handle_ = h;
  M3_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes) == cudaSuccess, "cuBLASLt workspace: cudaMalloc of {} bytes failed",
           kWorkspaceBytes);
  workspace_bytes_ = kWorkspaceBytes;
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

// Column-major view: D (N x M, ld out_stride) = op(A) (N x K) * B (K x M), where A is W stored
// column-major as K x N (ld K) and transposed, and B is x stored column-major as K x M.
CublasLtGemm::Plan& CublasLtGemm::plan_for(int m, int n, int k, int64_t x_stride, int64_t out_stride,
                                           int alignment) {
  const Key key{m, n, k, x_stride, out_stride, alignment};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  check_lt(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb), "transb");
  check_lt(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, x_stride), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, n, m, out_stride), "layout C");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                sizeof workspace_bytes_),
           "preference workspace");
  // The heuristic assumes 256-byte aligned matrices unless told otherwise.
  const uint32_t align = static_cast<uint32_t>(alignment);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align), "preference alignment");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->desc, p->a, p->b,
                                                          p->c, p->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_lt(s, "algorithm heuristic");
  M3_CHECK(found > 0, "cuBLASLt has no bf16 algorithm for M={} N={} K={}", m, n, k);
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void CublasLtGemm::gemm_bf16(const uint16_t* x, int64_t x_stride, int m, const uint16_t* w, int n, int k,
                             uint16_t* out, int64_t out_stride, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  // The largest power of two (<= 256) that divides every pointer and row stride in bytes.
  uintptr_t bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out) |
                   static_cast<uintptr_t>(x_stride * 2) | static_cast<uintptr_t>(out_stride * 2) |
                   static_cast<uintptr_t>(k * 2) | 256u;
  const int alignment = static_cast<int>(bits & (~bits + 1));
  Plan& p = plan_for(m, n, k, x_stride, out_stride, alignment);
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c,
                          out, p.c, &p.algo, workspace_, workspace_bytes_, stream),
           "cublasLtMatmul");
}

}  // namespace m3::cuda
