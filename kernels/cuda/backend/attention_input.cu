// The fused attention input path: after the Q/K/V (+ index-K, index-q) projections, one launch
// applies the per-head Gemma norms and partial RoPE and writes K, V and index-K quantized into the
// paged cache. Unfused, the same work takes four head_norm_rope launches and kv_insert, each reading and
// writing the rows again; here every row is read once, normed and roped in shared memory, and
// written once (to the activation, and encoded to the cache). Results are bit-identical to the
// separate ops (same row_ops.cuh code).
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/row_ops.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kWarps = 8;

// CTAs (token, group of kWarps rows); one warp per row of the token: q heads, k heads, v heads,
// index-K, index-q heads. Several CTAs per token so that a decode step of few tokens still fills
// the GPU.
__global__ void __launch_bounds__(kWarps * 32) attention_input_kernel(const AttentionInputArgs a) {
  kernel_prologue();
  extern __shared__ float rows_buf[];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, warp = threadIdx.x >> 5;
  const int hq = a.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int width = d > c.index_dim ? d : c.index_dim;
  float* v = rows_buf + warp * width;
  const float* cos_row = a.cos + int64_t(t) * a.rope_half;
  const float* sin_row = a.sin + int64_t(t) * a.rope_half;
  const int32_t slot = a.step.slot_mapping[t];
  const int64_t block = slot / c.block_size;
  const int row = slot % c.block_size;
  const int ik_tasks = a.index_k != nullptr ? 1 : 0;
  const int tasks = hq + 2 * hkv + ik_tasks + (a.index_q != nullptr ? a.index_heads : 0);
  for (int task = blockIdx.y * kWarps + warp; task < tasks; task += gridDim.y * kWarps) {
    if (task < hq) {
      uint16_t* x = a.q + (int64_t(t) * hq + task) * d;
      warp_head_norm_rope(x, x, v, d, a.q_norm, a.eps, a.rope_dims, cos_row, sin_row, a.rope_half);
    } else if (task < hq + hkv) {
      const int head = task - hq;
      uint16_t* x = a.k + (int64_t(t) * hkv + head) * d;
      warp_head_norm_rope(x, x, v, d, a.k_norm, a.eps, a.rope_dims, cos_row, sin_row, a.rope_half);
      if (slot >= 0) warp_encode_row(c.kv_dtype, v, d, c.kv_row(block, 0, head, row), c.kv_row_scales(block, 0, head, row));
    } else if (task < hq + 2 * hkv) {
      const int head = task - hq - hkv;
      if (slot < 0) continue;
      warp_load_bf16(a.v + (int64_t(t) * hkv + head) * d, v, d);
      warp_encode_row(c.kv_dtype, v, d, c.kv_row(block, 1, head, row), c.kv_row_scales(block, 1, head, row));
    } else if (task >= hq + 2 * hkv + ik_tasks) {
      const int head = task - hq - 2 * hkv - ik_tasks;
      uint16_t* x = a.index_q + (int64_t(t) * a.index_heads + head) * c.index_dim;
      warp_head_norm_rope(x, x, v, c.index_dim, a.index_q_norm, a.eps, a.index_rope_dims, cos_row, sin_row,
                          a.rope_half);
    } else {
      uint16_t* x = a.index_k + int64_t(t) * c.index_dim;
      warp_head_norm_rope(x, x, v, c.index_dim, a.index_k_norm, a.eps, a.index_rope_dims, cos_row, sin_row,
                          a.rope_half);
      if (slot >= 0) warp_encode_row(c.index_dtype, v, c.index_dim, c.index_row(block, row), c.index_row_scales(block, row));
    }
  }
}

}  // namespace

cudaError_t launch_attention_input(const AttentionInputArgs& a, cudaStream_t stream) {
  if (a.step.num_tokens == 0) return cudaSuccess;
  const int width = a.cache.head_dim > a.cache.index_dim ? a.cache.head_dim : a.cache.index_dim;
  const int tasks = a.num_q_heads + 2 * a.cache.num_kv_heads + (a.index_k != nullptr ? 1 : 0) +
                    (a.index_q != nullptr ? a.index_heads : 0);
  const dim3 grid(a.step.num_tokens, (tasks + kWarps - 1) / kWarps);
  launch_kernel(attention_input_kernel, grid, kWarps * 32, kWarps * width * sizeof(float), stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
