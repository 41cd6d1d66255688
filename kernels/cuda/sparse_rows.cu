// Sparse attention of one query row over its selected blocks, NVFP4 KV cache (Q8KV4), on FP8
// wgmma: the decode path of MSA. One CTA (one warpgroup) per (query token, KV head, selection slot
// range) runs sparse_nvfp4.cuh's row walk; 4 CTAs fit on a multiprocessor (about 110 registers,
// 42 KB of shared memory). Row groups (prefill) and other KV dtypes take attention.cu (NVFP4 groups
// sparse_groups.cu in a build with M3_CUDA_UNCHECKED).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sparse_nvfp4.cuh"

namespace m3::cuda::detail {
namespace {

using namespace sparse_nvfp4;

constexpr int kSmemBytes = kQBytes + kTableBytes + kVtBytes + kPtBytes + kStages * kStageBytes + kListInts * 4;

__global__ void __launch_bounds__(kThreads) sparse_rows_kernel(const AttentionArgs a) {
  kernel_prologue();
  extern __shared__ __align__(128) uint8_t smem[];
  uint2* table = reinterpret_cast<uint2*>(smem + kQBytes);
  uint8_t* vt = smem + kQBytes + kTableBytes;
  uint8_t* pt = vt + kVtBytes;
  uint8_t* stages = pt + kPtBytes;
  int* lists = reinterpret_cast<int*>(stages + kStages * kStageBytes);

  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  const SparseWork w = static_cast<const SparseWork*>(a.work)[blockIdx.x];
  for (int c = threadIdx.x; c < 128; c += kThreads) cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  row_walk(a, RowWalkSmem{smem, table, vt, pt, stages, lists}, w.row, w.kv_head, w.begin, w.end, w.partial);
}

}  // namespace

cudaError_t init_sparse_rows_kernel() {
  return cudaFuncSetAttribute(sparse_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
}

int sparse_rows_ctas_per_sm() { return ctas_per_sm(sparse_rows_kernel, kSmemBytes); }

cudaError_t launch_sparse_rows(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  if (a.cache.kv_dtype != KvDType::kNVFP4) return cudaErrorInvalidValue;
  launch_kernel(sparse_rows_kernel, a.num_work, kThreads, kSmemBytes, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
