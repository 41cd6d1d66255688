// The attention ops of ops/attention.h for any geometry (head and index dims, block size, float32
// caches) that the MSA kernels (kernels/cuda/*.cu, built for the M3 shape) do not take: the tiny
// checkpoints of the tests, odd configs. Simple and exact rather than fast: every dot product and
// every sum runs in the CPU reference's order with fp32 operations that are not contracted, so the
// results match kernels/cpu/attention.cc up to the last bit of expf.
#include <cstdint>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cached_row.cuh"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/row_ops.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

// dot(q, row) in sequential fp32 as the reference's dot().
__device__ __forceinline__ float seq_dot(const float* q, KvDType dtype, const uint8_t* data, const uint8_t* scales,
                                         int n, bool e4m3_view) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(q[i], cached_value(dtype, data, scales, i, e4m3_view)));
  return acc;
}

// ---- kv insert: one warp per (token, row to write) ----
__global__ void kv_insert_kernel(const StepView step, const KvLayerView cache, const uint16_t* k, const uint16_t* v,
                                 const uint16_t* index_k) {
  kernel_prologue();
  extern __shared__ float insert_buf[];
  const int warp = threadIdx.x >> 5;
  const int hkv = cache.num_kv_heads;
  const int per_token = 2 * hkv + (index_k != nullptr && cache.index_dim > 0 ? 1 : 0);
  const int task = blockIdx.x * (blockDim.x >> 5) + warp;
  if (task >= step.num_tokens * per_token) return;
  const int t = task / per_token, which = task % per_token;
  const int32_t slot = step.slot_mapping[t];
  if (slot < 0) return;
  const int64_t block = slot / cache.block_size;
  const int row = slot % cache.block_size;
  const int width = cache.head_dim > cache.index_dim ? cache.head_dim : cache.index_dim;
  float* buf = insert_buf + warp * width;
  if (which < 2 * hkv) {
    const int kind = which / hkv, head = which % hkv;
    const uint16_t* src = (kind == 0 ? k : v) + (int64_t(t) * hkv + head) * cache.head_dim;
    warp_load_bf16(src, buf, cache.head_dim);
    warp_encode_row(cache.kv_dtype, buf, cache.head_dim, cache.kv_row(block, kind, head, row),
                    cache.kv_row_scales(block, kind, head, row));
  } else {
    warp_load_bf16(index_k + int64_t(t) * cache.index_dim, buf, cache.index_dim);
    warp_encode_row(cache.index_dtype, buf, cache.index_dim, cache.index_row(block, row),
                    cache.index_row_scales(block, row));
  }
}

// ---- indexer: one CTA of 128 threads per (token, index head) ----
__global__ void __launch_bounds__(128) indexer_kernel(const StepView step, const KvLayerView cache,
                                                      const uint16_t* index_q, const IndexerParams p,
                                                      int32_t* selection) {
  kernel_prologue();
  extern __shared__ float indexer_buf[];
  const int t = blockIdx.x, j = blockIdx.y, di = cache.index_dim, bs = cache.block_size;
  float* q = indexer_buf;
  float* score = indexer_buf + di;
  __shared__ float red_v[4];
  __shared__ int red_i[4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pos = step.positions[t], seq = step.token_seq[t];
  const int32_t* pages = step.page_table + int64_t(seq) * step.pages_per_seq;
  const int local = pos / bs, visible = local + 1;
  const bool q8 = e4m3_queries(cache.index_dtype);
  for (int i = threadIdx.x; i < di; i += blockDim.x) {
    const float x = bf16_decode(index_q[(int64_t(t) * p.index_heads + j) * di + i]);
    q[i] = q8 ? fp8_e4m3_round(x) : x;
  }
  __syncthreads();
  for (int b = warp; b < visible; b += 4) {
    const int64_t phys = pages[b];
    const int rows = min(bs, pos - b * bs + 1);
    float m = -INFINITY;
    for (int r = lane; r < rows; r += 32)
      m = fmaxf(m, seq_dot(q, cache.index_dtype, cache.index_row(phys, r), cache.index_row_scales(phys, r), di, true));
    m = warp_max(m);
    if (lane == 0) score[b] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int l = 0; l < p.local_blocks; ++l) score[max(local - l, 0)] = INFINITY;
    for (int b = 0; b < min(p.init_blocks, visible); ++b) score[b] = INFINITY;
  }
  __syncthreads();
  const int seq_blocks = (step.seq_lens[seq] + bs - 1) / bs;
  const int n = min(min(p.topk_blocks, seq_blocks), visible);
  int32_t* out = selection + (int64_t(t) * p.index_heads + j) * p.topk_blocks;
  int written = 0;
  for (int round = 0; round < n; ++round) {
    float best = -INFINITY;
    int best_b = 1 << 30;
    for (int b = threadIdx.x; b < visible; b += blockDim.x) {
      const float s = score[b];
      if (s > best || (s == best && b < best_b)) {
        best = s;
        best_b = b;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_b, o);
      if (ob > best || (ob == best && oi < best_b)) {
        best = ob;
        best_b = oi;
      }
    }
    if (lane == 0) {
      red_v[warp] = best;
      red_i[warp] = best_b;
    }
    __syncthreads();
    best = red_v[0];
    best_b = red_i[0];
    for (int w = 1; w < 4; ++w)
      if (red_v[w] > best || (red_v[w] == best && red_i[w] < best_b)) {
        best = red_v[w];
        best_b = red_i[w];
      }
    __syncthreads();
    if (best == -INFINITY) break;  // every remaining block has no visible key
    if (threadIdx.x == 0) {
      out[written] = best_b;
      score[best_b] = -INFINITY;
    }
    ++written;
    __syncthreads();
  }
  for (int i = written + threadIdx.x; i < p.topk_blocks; i += blockDim.x) out[i] = -1;
}

// ---- attention: one CTA per (token, KV head), one warp per query head of the group ----
constexpr int kMaxChannelsPerLane = 8;  // head_dim <= 256

struct AttnParams {
  StepView step;
  KvLayerView cache;
  const uint16_t* q;
  int num_q_heads;
  const int32_t* selection;
  int topk;
  float sm_scale;
  uint16_t* out;
};

__global__ void attention_kernel(const AttnParams a) {
  kernel_prologue();
  extern __shared__ float attn_buf[];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, g = blockIdx.y, hkv = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
  const int group = a.num_q_heads / hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool q8kv4 = c.kv_dtype == KvDType::kNVFP4;
  int* blocks = reinterpret_cast<int*>(attn_buf);  // [max_blocks]
  float* wbuf = attn_buf + a.step.max_blocks + warp * (d + 32);
  float* qv = wbuf;
  float* pv = wbuf + d;
  __shared__ int num_blocks;
  const int pos = a.step.positions[t], seq = a.step.token_seq[t];
  const int32_t* pages = a.step.page_table + int64_t(seq) * a.step.pages_per_seq;
  const int local = pos / bs;
  if (threadIdx.x == 0) {
    int n = 0;
    if (a.selection == nullptr) {
      for (int b = 0; b <= local; ++b) blocks[n++] = b;
    } else {
      // The union of the selected blocks in ascending order (-1 and repeats ignored).
      const int32_t* sel = a.selection + (int64_t(t) * hkv + g) * a.topk;
      for (int i = 0; i < a.topk; ++i) {
        const int b = sel[i];
        if (b < 0 || b > local) continue;
        int j = n;
        bool dup = false;
        for (int k = 0; k < n; ++k) dup |= blocks[k] == b;
        if (dup) continue;
        while (j > 0 && blocks[j - 1] > b) {
          blocks[j] = blocks[j - 1];
          --j;
        }
        blocks[j] = b;
        ++n;
      }
    }
    num_blocks = n;
  }
  const int qh = g * group + warp;
  for (int i = lane; i < d; i += 32) {
    const float x = bf16_decode(a.q[(int64_t(t) * a.num_q_heads + qh) * d + i]);
    qv[i] = q8kv4 ? fp8_e4m3_round(x) : x;
  }
  __syncthreads();
  const int nb = num_blocks;
  // logit of key r of block index bi (scaled for the plain path, raw for Q8KV4)
  auto logit = [&](int bi, int r) {
    const int64_t phys = pages[blocks[bi]];
    const float dot = seq_dot(qv, c.kv_dtype, c.kv_row(phys, 0, g, r), c.kv_row_scales(phys, 0, g, r), d, q8kv4);
    return q8kv4 ? dot : __fmul_rn(dot, a.sm_scale);
  };
  auto rows_of = [&](int bi) { return min(bs, pos - blocks[bi] * bs + 1); };
  float m = -INFINITY;
  for (int bi = 0; bi < nb; ++bi)
    for (int r = lane; r < rows_of(bi); r += 32) m = fmaxf(m, logit(bi, r));
  m = warp_max(m);
  auto weight = [&](float l) {
    return q8kv4 ? __fmul_rn(448.0f, expf(__fmul_rn(a.sm_scale, __fsub_rn(l, m)))) : expf(__fsub_rn(l, m));
  };
  float sum = 0.0f;
  for (int bi = 0; bi < nb; ++bi)
    for (int r0 = 0; r0 < rows_of(bi); r0 += 32) {
      const int r = r0 + lane, n = min(32, rows_of(bi) - r0);
      if (r - r0 < n) pv[lane] = weight(logit(bi, r));
      __syncwarp();
      if (lane == 0)
        for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, pv[i]);
      __syncwarp();
    }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  float acc[kMaxChannelsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxChannelsPerLane; ++i) acc[i] = 0.0f;
  for (int bi = 0; bi < nb; ++bi) {
    const int64_t phys = pages[blocks[bi]];
    for (int r0 = 0; r0 < rows_of(bi); r0 += 32) {
      const int r = r0 + lane, n = min(32, rows_of(bi) - r0);
      if (r - r0 < n) {
        const float e = weight(logit(bi, r));
        pv[lane] = __fdiv_rn(q8kv4 ? fp8_e4m3_round(e) : e, sum);
      }
      __syncwarp();
      for (int i = 0; i < n; ++i) {
        const uint8_t* vrow = c.kv_row(phys, 1, g, r0 + i);
        const uint8_t* vsc = c.kv_row_scales(phys, 1, g, r0 + i);
#pragma unroll
        for (int j = 0; j < kMaxChannelsPerLane; ++j) {
          const int ch = lane + 32 * j;
          if (ch < d) acc[j] = __fadd_rn(acc[j], __fmul_rn(pv[i], cached_value(c.kv_dtype, vrow, vsc, ch, q8kv4)));
        }
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxChannelsPerLane; ++j) {
    const int ch = lane + 32 * j;
    if (ch < d) a.out[(int64_t(t) * a.num_q_heads + qh) * d + ch] = f32_to_bf16_bits(nb > 0 ? acc[j] : 0.0f);
  }
}

}  // namespace

cudaError_t launch_generic_kv_insert(const StepView& step, const KvLayerView& cache, const uint16_t* k,
                                     const uint16_t* v, const uint16_t* index_k, cudaStream_t stream) {
  const int per_token = 2 * cache.num_kv_heads + (index_k != nullptr && cache.index_dim > 0 ? 1 : 0);
  const int tasks = step.num_tokens * per_token;
  if (tasks == 0) return cudaSuccess;
  const int width = cache.head_dim > cache.index_dim ? cache.head_dim : cache.index_dim;
  launch_kernel(kv_insert_kernel, (tasks + 7) / 8, 256, 8 * width * sizeof(float), stream, step, cache, k, v, index_k);
  return cudaGetLastError();
}

cudaError_t launch_generic_indexer_topk(const StepView& step, const KvLayerView& cache, const uint16_t* index_q,
                                        const IndexerParams& params, int32_t* selection, cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const size_t smem = (size_t(cache.index_dim) + step.max_blocks) * sizeof(float);
  launch_kernel(indexer_kernel, dim3(step.num_tokens, params.index_heads), 128, smem, stream, step, cache, index_q, params,
                                                                                   selection);
  return cudaGetLastError();
}

cudaError_t launch_generic_attention(const StepView& step, const KvLayerView& cache, const uint16_t* q,
                                     int num_q_heads, const int32_t* selection, int topk, float sm_scale,
                                     uint16_t* out, cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const int group = num_q_heads / cache.num_kv_heads;
  if (group > 32 || cache.head_dim > 32 * kMaxChannelsPerLane) return cudaErrorInvalidValue;
  AttnParams a{step, cache, q, num_q_heads, selection, topk, sm_scale, out};
  const size_t smem = (size_t(step.max_blocks) + size_t(group) * (cache.head_dim + 32)) * sizeof(float);
  launch_kernel(attention_kernel, dim3(step.num_tokens, cache.num_kv_heads), 32 * group, smem, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
