// The DSpark drafter's two ops (ops/backend.h draft_block_attention, markov_drafts). Simple and
// exact rather than fast, as the generic attention path: every dot product and sum runs in the CPU
// reference's order with fp32 operations that are not contracted.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <mma.h>

#include "formats/bf16.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cached_row.cuh"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

// ---- draft_block_attention: one CTA per (token, KV head), one warp per query head of the group ----
constexpr int kMaxChannelsPerLane = 8;  // head_dim <= 256

struct DraftAttnParams {
  StepView step;
  KvLayerView cache;
  const uint16_t* q;
  int num_q_heads;
  const uint16_t* block_k;
  const uint16_t* block_v;
  int block_len;
  int window;
  float sm_scale;
  uint16_t* out;
};

// Key i of block s's keys: a cached context row (i < ctx: position ctx_first + i, in the cache's
// dtype) or row i - ctx of the block's own K or V (bf16 activations). which: 0 = K, 1 = V.
__device__ __forceinline__ const uint8_t* draft_key_row(const DraftAttnParams& a, const int32_t* pages, int s, int g,
                                                        int ctx, int ctx_first, int i, int which, KvDType& dtype) {
  const KvLayerView& c = a.cache;
  if (i < ctx) {
    const int p = ctx_first + i;
    dtype = c.kv_dtype;
    return c.kv_row(pages[p / c.block_size], which, g, p % c.block_size);
  }
  dtype = KvDType::kBF16;
  const uint16_t* rows = which == 0 ? a.block_k : a.block_v;
  return reinterpret_cast<const uint8_t*>(rows + ((int64_t(s) * a.block_len + (i - ctx)) * c.num_kv_heads + g) * c.head_dim);
}

__global__ void draft_block_attention_kernel(const DraftAttnParams a) {
  kernel_prologue();
  extern __shared__ float draft_buf[];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, g = blockIdx.y, hkv = c.num_kv_heads, d = c.head_dim;
  const int group = a.num_q_heads / hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* qv = draft_buf + warp * (d + 32);
  float* pv = qv + d;
  const int s = t / a.block_len, pos = a.step.positions[t];
  const int last = a.step.seq_lens[s] - a.block_len - 1;
  const int first = max(0, pos - a.window + 1);
  const int context = max(0, last - first + 1), n = context + a.block_len;
  const int32_t* pages = a.step.page_table + int64_t(s) * a.step.pages_per_seq;
  const int qh = g * group + warp;
  for (int i = lane; i < d; i += 32) qv[i] = bf16_decode(a.q[(int64_t(t) * a.num_q_heads + qh) * d + i]);
  __syncwarp();
  auto row_of = [&](int i, int which, KvDType& dtype) {
    return draft_key_row(a, pages, s, g, context, first, i, which, dtype);
  };
  auto logit = [&](int i) {
    KvDType dtype;
    const uint8_t* row = row_of(i, 0, dtype);
    return __fmul_rn(reference_dot(qv, dtype, row, nullptr, d, false), a.sm_scale);
  };
  float m = -INFINITY;
  for (int i = lane; i < n; i += 32) m = fmaxf(m, logit(i));
  m = warp_max(m);
  float sum = 0.0f;
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int cnt = min(32, n - i0);
    if (lane < cnt) pv[lane] = expf(__fsub_rn(logit(i0 + lane), m));
    __syncwarp();
    if (lane == 0)
      for (int i = 0; i < cnt; ++i) sum = __fadd_rn(sum, pv[i]);
    __syncwarp();
  }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  float acc[kMaxChannelsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxChannelsPerLane; ++j) acc[j] = 0.0f;
  for (int i0 = 0; i0 < n; i0 += 32) {
    const int cnt = min(32, n - i0);
    if (lane < cnt) pv[lane] = __fdiv_rn(expf(__fsub_rn(logit(i0 + lane), m)), sum);
    __syncwarp();
    for (int i = 0; i < cnt; ++i) {
      KvDType dtype;
      const uint8_t* vrow = row_of(i0 + i, 1, dtype);
#pragma unroll
      for (int j = 0; j < kMaxChannelsPerLane; ++j) {
        const int ch = lane + 32 * j;
        if (ch < d) acc[j] = __fadd_rn(acc[j], __fmul_rn(pv[i], cached_value(dtype, vrow, nullptr, ch, false)));
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int j = 0; j < kMaxChannelsPerLane; ++j) {
    const int ch = lane + 32 * j;
    if (ch < d) a.out[(int64_t(t) * a.num_q_heads + qh) * d + ch] = f32_to_bf16_bits(acc[j]);
  }
}

// ---- draft_block_attention, tiled: one CTA per (block, KV head, key split) ----
// The block's queries of one KV head (rows = block_len x group, at most 128) stay in shared memory
// as bf16; the split's keys stream through it in tiles of kTileKeys, and the two products run on
// the tensor cores (WMMA, bf16 in, fp32 out): S = Q K^T per tile, then O += P V. Two passes over
// the split's keys: the first finds each row's max, the second sums exp(s - max) and P V with O in
// the warps' accumulator fragments (no rescaling). Each split writes its unnormalised sums; a
// second kernel merges the splits. K, V and P meet the tensor cores in bf16 (the cache's bf16 and
// fp8 values exactly, f32 ones rounded); sums are fp32. For head_dim a multiple of 16 up to 256;
// the simple kernel above takes any other geometry.
constexpr int kTiledThreads = 256, kTileKeys = 64, kTiledMaxRows = 128;

struct TiledAttnParams {
  DraftAttnParams a;
  int group, rows;  // query heads per KV head; rows = block_len * group
  int splits, split_keys;  // key splits per (block, KV head), keys per split (a multiple of kTileKeys)
  float* part_o;   // [blocks * hkv * splits, rows, head_dim] unnormalised sums
  float* part_ml;  // [blocks * hkv * splits, rows, 2]: max and sum
};

inline size_t tiled_smem_bytes(int rows, int d) {
  const size_t rt = size_t((rows + 15) / 16) * 16;
  const size_t tiles = 2 * size_t(kTileKeys) * d * 2 + rt * kTileKeys * 4;  // K, V (bf16) and S (fp32)
  const size_t o = rt * d * 4;                                               // O staged at the end, over them
  return rt * d * 2 + std::max(tiles, o) + rt * kTileKeys * 2 + 2 * rt * 4;  // + Q, P, row max and sum
}

__global__ void __launch_bounds__(kTiledThreads) draft_attention_tiled_kernel(const TiledAttnParams p) {
  kernel_prologue();
  using namespace nvcuda;
  extern __shared__ __align__(128) uint8_t tiled_buf[];  // WMMA tiles want 32-byte alignment
  const DraftAttnParams& a = p.a;
  const KvLayerView& c = a.cache;
  const int s = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int hkv = c.num_kv_heads, d = c.head_dim, n = a.block_len, rows = p.rows;
  const int rt = (rows + 15) / 16;  // row tiles: warp w < rt owns rows 16w .. 16w + 15
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* base_ptr = tiled_buf;
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(base_ptr);  // [rt*16][d]
  uint8_t* tiles = base_ptr + size_t(rt) * 16 * d * 2;
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(tiles);     // [kTileKeys][d]
  __nv_bfloat16* vs = ks + kTileKeys * d;                           // [kTileKeys][d]
  float* sc = reinterpret_cast<float*>(vs + kTileKeys * d);         // [rt*16][kTileKeys]
  float* os = reinterpret_cast<float*>(tiles);                      // [rt*16][d], at the end
  const size_t tiles_bytes = std::max(2 * size_t(kTileKeys) * d * 2 + size_t(rt) * 16 * kTileKeys * 4,
                                      size_t(rt) * 16 * d * 4);
  __nv_bfloat16* ps = reinterpret_cast<__nv_bfloat16*>(tiles + tiles_bytes);  // [rt*16][kTileKeys]
  float* row_m = reinterpret_cast<float*>(ps + rt * 16 * kTileKeys);          // [rt*16]
  float* row_l = row_m + rt * 16;                                              // [rt*16]
  const int first_token = s * n;
  const int pos0 = a.step.positions[first_token];  // the block's first query: P + 1
  const int last = a.step.seq_lens[s] - n - 1;      // P
  const int ctx_first = max(0, pos0 - a.window + 1);
  const int ctx = max(0, last - ctx_first + 1), keys = ctx + n;
  const int32_t* pages = a.step.page_table + int64_t(s) * a.step.pages_per_seq;
  // Query row r = j * group + h: token first_token + j, head g * group + h; rows past `rows` zero.
  for (int e = threadIdx.x; e < rt * 16 * d; e += blockDim.x) {
    const int r = e / d, ch = e - r * d, j = r / p.group, h = r - j * p.group;
    const uint16_t bits = r < rows ? a.q[(int64_t(first_token + j) * a.num_q_heads + g * p.group + h) * d + ch] : 0;
    qs[e] = __ushort_as_bfloat16(bits);
  }
  for (int r = threadIdx.x; r < rt * 16; r += blockDim.x) row_m[r] = -INFINITY, row_l[r] = 0.0f;
  auto key_row = [&](int i, int which, KvDType& dtype) {
    return draft_key_row(a, pages, s, g, ctx, ctx_first, i, which, dtype);
  };
  // A tile's K (and V) rows as bf16; keys past `count` are zero.
  auto load_tile = [&](int base, int count, bool with_v) {
    for (int e = threadIdx.x; e < kTileKeys * d; e += blockDim.x) {
      const int k = e / d, x = e - k * d;
      float kx = 0.0f, vx = 0.0f;
      if (k < count) {
        KvDType dtype;
        const uint8_t* krow = key_row(base + k, 0, dtype);
        kx = cached_value(dtype, krow, nullptr, x, false);
        if (with_v) {
          const uint8_t* vrow = key_row(base + k, 1, dtype);
          vx = cached_value(dtype, vrow, nullptr, x, false);
        }
      }
      ks[e] = __float2bfloat16_rn(kx);
      if (with_v) vs[e] = __float2bfloat16_rn(vx);
    }
  };
  // S = Q K^T for this warp's row tile into sc (fp32), then each of its rows' logits masked.
  auto scores = [&](int base, int count) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTileKeys / 16];
#pragma unroll
    for (int t = 0; t < kTileKeys / 16; ++t) wmma::fill_fragment(acc[t], 0.0f);
    for (int x = 0; x < d; x += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
      wmma::load_matrix_sync(qa, qs + warp * 16 * d + x, d);
#pragma unroll
      for (int t = 0; t < kTileKeys / 16; ++t) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
        wmma::load_matrix_sync(kb, ks + t * 16 * d + x, d);
        wmma::mma_sync(acc[t], qa, kb, acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < kTileKeys / 16; ++t)
      wmma::store_matrix_sync(sc + warp * 16 * kTileKeys + t * 16, acc[t], kTileKeys, wmma::mem_row_major);
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr;
      const int qpos = pos0 + (r < rows ? r : 0) / p.group;
      for (int k = lane; k < kTileKeys; k += 32) {
        const int i = base + k;
        const bool visible = r < rows && k < count && (i >= ctx || ctx_first + i >= qpos - a.window + 1);
        sc[r * kTileKeys + k] = visible ? sc[r * kTileKeys + k] * a.sm_scale : -INFINITY;
      }
    }
    __syncwarp();
  };
  const int begin = split * p.split_keys, end = min(keys, begin + p.split_keys);
  __syncthreads();
  // Pass 1: each row's max over the split.
  for (int base = begin; base < end; base += kTileKeys) {
    const int count = min(kTileKeys, end - base);
    load_tile(base, count, false);
    __syncthreads();
    if (warp < rt) {
      scores(base, count);
      for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr;
        const float mx = warp_max(fmaxf(sc[r * kTileKeys + lane], sc[r * kTileKeys + lane + 32]));
        if (lane == 0) row_m[r] = fmaxf(row_m[r], mx);
      }
    }
    __syncthreads();
  }
  // Pass 2: P = exp(s - max), its row sums, and O += P V in this warp's fragments.
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[256 / 16];
#pragma unroll
  for (int t = 0; t < 256 / 16; ++t) wmma::fill_fragment(o[t], 0.0f);
  for (int base = begin; base < end; base += kTileKeys) {
    const int count = min(kTileKeys, end - base);
    load_tile(base, count, true);
    __syncthreads();
    if (warp < rt) {
      scores(base, count);
      for (int rr = 0; rr < 16; ++rr) {
        const int r = warp * 16 + rr;
        const float m = row_m[r];
        float sum = 0.0f;
        for (int k = lane; k < kTileKeys; k += 32) {
          const float e = m == -INFINITY ? 0.0f : expf(sc[r * kTileKeys + k] - m);
          const __nv_bfloat16 pb = __float2bfloat16_rn(e);
          ps[r * kTileKeys + k] = pb;
          sum += __bfloat162float(pb);  // the weights the product uses
        }
        sum = warp_sum(sum);
        if (lane == 0) row_l[r] += sum;
      }
      __syncwarp();
      for (int kk = 0; kk < kTileKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, ps + warp * 16 * kTileKeys + kk, kTileKeys);
#pragma unroll
        for (int t = 0; t < 256 / 16; ++t) {
          if (t * 16 >= d) break;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
          wmma::load_matrix_sync(vb, vs + kk * d + t * 16, d);
          wmma::mma_sync(o[t], pa, vb, o[t]);
        }
      }
    }
    __syncthreads();
  }
  if (warp < rt) {
#pragma unroll
    for (int t = 0; t < 256 / 16; ++t) {
      if (t * 16 >= d) break;
      wmma::store_matrix_sync(os + warp * 16 * d + t * 16, o[t], d, wmma::mem_row_major);
    }
  }
  __syncthreads();
  const int64_t part = (int64_t(s) * hkv + g) * p.splits + split;
  for (int e = threadIdx.x; e < rows * d; e += blockDim.x) p.part_o[part * rows * d + e] = os[e];
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    p.part_ml[(part * rows + r) * 2] = row_m[r];
    p.part_ml[(part * rows + r) * 2 + 1] = row_l[r];
  }
}

// out[t, head] = the splits' sums merged: sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c.
__global__ void draft_attention_merge_kernel(const TiledAttnParams p) {
  kernel_prologue();
  const DraftAttnParams& a = p.a;
  const int t = blockIdx.x, head = blockIdx.y, d = a.cache.head_dim, hkv = a.cache.num_kv_heads;
  const int s = t / a.block_len, j = t - s * a.block_len, g = head / p.group, h = head - g * p.group;
  const int r = j * p.group + h;
  const int64_t first = (int64_t(s) * hkv + g) * p.splits;
  float mx = -INFINITY;
  for (int c = 0; c < p.splits; ++c) mx = fmaxf(mx, p.part_ml[((first + c) * p.rows + r) * 2]);
  float l = 0.0f;
  for (int c = 0; c < p.splits; ++c) {
    const float m = p.part_ml[((first + c) * p.rows + r) * 2];
    if (m != -INFINITY) l += expf(m - mx) * p.part_ml[((first + c) * p.rows + r) * 2 + 1];
  }
  for (int ch = threadIdx.x; ch < d; ch += blockDim.x) {
    float o = 0.0f;
    for (int c = 0; c < p.splits; ++c) {
      const float m = p.part_ml[((first + c) * p.rows + r) * 2];
      if (m != -INFINITY) o += expf(m - mx) * p.part_o[((first + c) * p.rows + r) * d + ch];
    }
    a.out[(int64_t(t) * a.num_q_heads + head) * d + ch] = f32_to_bf16_bits(l > 0.0f ? o / l : 0.0f);
  }
}

// ---- markov_drafts: per draft j, every block's adjusted logits scanned for their argmax ----

// A row's candidate as one u64 that compares as the argmax orders: the logit's bits mapped onto
// an order-preserving uint32 (-0 read as +0), then the id reversed (a tie goes to the lower id). NaN
// is 0, below every real candidate, and never wins.
__device__ __forceinline__ unsigned long long argmax_key(float logit, int32_t id) {
  if (isnan(logit)) return 0ull;
  uint32_t u = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t argmax_id(unsigned long long key) {
  return key == 0ull ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

__device__ __forceinline__ int32_t markov_prev(const MarkovDraftArgs& a, int block, int j) {
  const int64_t first_row = int64_t(block) * a.block_len;
  return j == 0 ? a.token_ids[a.logits_rows[first_row]] : argmax_id(a.keys[first_row + j - 1]);
}

// Draft j of every block at once: a CTA streams kMarkovRows vocabulary rows of w2 through shared
// memory (read once per draft, whatever the batch) in tiles of 32, beside the w1 rows of its
// kMarkovReqPerCta blocks' previous tokens; each warp scores its kMarkovReqPerWarp blocks against
// the tile (lane = vocabulary row), each dot in draft_head_dot's order, from float4 reads (the w1
// ones broadcast); one atomicMax per (CTA, block) takes the best key into keys[row].
constexpr int kMarkovThreads = 256, kMarkovWarps = kMarkovThreads / 32;
constexpr int kMarkovReqPerWarp = 4, kMarkovReqPerCta = kMarkovWarps * kMarkovReqPerWarp;
constexpr int kMarkovRows = 128;     // vocabulary rows per CTA

__host__ __device__ inline int markov_rank4(int rank) { return (rank + 3) & ~3; }
inline size_t markov_smem_bytes(int rank) {
  return sizeof(float) * (size_t(32) * (markov_rank4(rank) + 4) + size_t(kMarkovReqPerCta) * markov_rank4(rank));
}

__global__ void __launch_bounds__(kMarkovThreads) markov_step_kernel(const MarkovDraftArgs a, int j) {
  kernel_prologue();
  extern __shared__ float4 markov_buf4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = a.rank, r4 = markov_rank4(r), stride = r4 + 4;  // 16-byte rows; lane l's row l conflict-free
  float* w2_tile = reinterpret_cast<float*>(markov_buf4);
  float* w1_rows = w2_tile + 32 * stride;  // [kMarkovReqPerCta][r4]
  const int first_block = blockIdx.y * kMarkovReqPerCta;
  for (int e = threadIdx.x; e < kMarkovReqPerCta * r; e += blockDim.x) {
    const int q = e / r, col = e - q * r, b = first_block + q;
    w1_rows[q * r4 + col] = b < a.num_blocks ? a.w1[int64_t(markov_prev(a, b, j)) * r + col] : 0.0f;
  }
  int block[kMarkovReqPerWarp];
  unsigned long long best[kMarkovReqPerWarp];
#pragma unroll
  for (int q = 0; q < kMarkovReqPerWarp; ++q) {
    block[q] = first_block + warp * kMarkovReqPerWarp + q;
    best[q] = 0ull;
  }
  const int r8 = r & ~7;
  const int64_t begin = int64_t(blockIdx.x) * kMarkovRows;
  for (int64_t tile = begin; tile < begin + kMarkovRows && tile < a.vocab; tile += 32) {
    const int rows = static_cast<int>(a.vocab - tile < 32 ? a.vocab - tile : 32);
    __syncthreads();
    if (r % 4 == 0) {  // float4 loads (the tile's rows are contiguous in w2)
      const float4* src = reinterpret_cast<const float4*>(a.w2 + tile * r);
      for (int e = threadIdx.x; e < rows * r / 4; e += blockDim.x) {
        const int row = e / (r / 4), col = (e - row * (r / 4)) * 4;
        *reinterpret_cast<float4*>(w2_tile + row * stride + col) = src[e];
      }
    } else {
      for (int e = threadIdx.x; e < rows * r; e += blockDim.x) {
        const int row = e / r, col = e - row * r;
        w2_tile[row * stride + col] = a.w2[(tile + row) * r + col];
      }
    }
    __syncthreads();
    if (lane >= rows) continue;
    const float* w2 = w2_tile + lane * stride;
    const int64_t v = tile + lane;
#pragma unroll
    for (int q = 0; q < kMarkovReqPerWarp; ++q) {
      if (block[q] >= a.num_blocks) continue;
      const float* w1 = w1_rows + (warp * kMarkovReqPerWarp + q) * r4;
      float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = 0; i < r8; i += 8) {
        const float4 x0 = *reinterpret_cast<const float4*>(w2 + i), x1 = *reinterpret_cast<const float4*>(w2 + i + 4);
        const float4 y0 = *reinterpret_cast<const float4*>(w1 + i), y1 = *reinterpret_cast<const float4*>(w1 + i + 4);
        part[0] = __fadd_rn(part[0], __fmul_rn(x0.x, y0.x));
        part[1] = __fadd_rn(part[1], __fmul_rn(x0.y, y0.y));
        part[2] = __fadd_rn(part[2], __fmul_rn(x0.z, y0.z));
        part[3] = __fadd_rn(part[3], __fmul_rn(x0.w, y0.w));
        part[4] = __fadd_rn(part[4], __fmul_rn(x1.x, y1.x));
        part[5] = __fadd_rn(part[5], __fmul_rn(x1.y, y1.y));
        part[6] = __fadd_rn(part[6], __fmul_rn(x1.z, y1.z));
        part[7] = __fadd_rn(part[7], __fmul_rn(x1.w, y1.w));
      }
      float dot = __fadd_rn(__fadd_rn(__fadd_rn(part[0], part[4]), __fadd_rn(part[2], part[6])),
                            __fadd_rn(__fadd_rn(part[1], part[5]), __fadd_rn(part[3], part[7])));
      for (int i = r8; i < r; ++i) dot = __fadd_rn(dot, __fmul_rn(w2[i], w1[i]));
      const int64_t row = int64_t(block[q]) * a.block_len + j;
      const float logit = __fadd_rn(bf16_decode(a.base[row * a.vocab + v]), dot);
      const unsigned long long key = argmax_key(logit, static_cast<int32_t>(v));
      best[q] = key > best[q] ? key : best[q];
    }
  }
#pragma unroll
  for (int q = 0; q < kMarkovReqPerWarp; ++q) {
    unsigned long long b = best[q];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, b, o);
      b = other > b ? other : b;
    }
    if (lane == 0 && block[q] < a.num_blocks && b != 0ull)
      atomicMax(a.keys + int64_t(block[q]) * a.block_len + j, b);
  }
}

// One warp per row: its id, and its confidence (lanes 0..7 sum a residue class each, lane 0 adds
// them in draft_head_dot's order).
__global__ void markov_finish_kernel(const MarkovDraftArgs a) {
  kernel_prologue();
  const int64_t row = blockIdx.x;
  const int block = static_cast<int>(row / a.block_len), j = static_cast<int>(row % a.block_len);
  const int lane = threadIdx.x;
  const int32_t prev = markov_prev(a, block, j);
  const uint16_t* x = a.normed + row * a.hidden;
  const float* w1 = a.w1 + int64_t(prev) * a.rank;
  auto partial = [&](const float* w, const float* f32, const uint16_t* bf, int n) {
    float acc = 0.0f;
    const int n8 = n & ~7;
    if (lane < 8)
      for (int i = lane; i < n8; i += 8) acc = __fadd_rn(acc, __fmul_rn(w[i], f32 ? f32[i] : bf16_decode(bf[i])));
    float lanes[8];
#pragma unroll
    for (int l = 0; l < 8; ++l) lanes[l] = __shfl_sync(0xffffffffu, acc, l);
    float total = __fadd_rn(__fadd_rn(__fadd_rn(lanes[0], lanes[4]), __fadd_rn(lanes[2], lanes[6])),
                            __fadd_rn(__fadd_rn(lanes[1], lanes[5]), __fadd_rn(lanes[3], lanes[7])));
    for (int i = n8; i < n; ++i) total = __fadd_rn(total, __fmul_rn(w[i], f32 ? f32[i] : bf16_decode(bf[i])));
    return total;
  };
  float c = partial(a.confidence_w, nullptr, x, a.hidden);
  if (a.confidence_with_markov) c = __fadd_rn(c, partial(a.confidence_w + a.hidden, w1, nullptr, a.rank));
  if (lane == 0) {
    a.ids[row] = argmax_id(a.keys[row]);
    a.confidence[row] = 1.0f / (1.0f + expf(-__fadd_rn(c, a.confidence_b)));
  }
}

}  // namespace

size_t draft_attention_scratch_floats(const StepView& step, const KvLayerView& cache, int num_q_heads, int block_len,
                                      int window, int sm_count, int* splits_out, int* split_keys_out) {
  const int group = num_q_heads / cache.num_kv_heads, rows = block_len * group, d = cache.head_dim;
  // WMMA tiles of 16: head_dim a multiple of 16 (at most 256), at most 128 query rows (a warp each).
  const bool tiled = d % 16 == 0 && d <= 256 && rows <= kTiledMaxRows;
  if (!tiled || step.num_seqs == 0) return 0;
  // Keys of a block: at most its window's context and the block (and what the pages hold).
  int64_t keys = int64_t(window) + block_len;
  if (step.max_blocks > 0) keys = std::min<int64_t>(keys, int64_t(step.max_blocks) * cache.block_size + block_len);
  const int max_splits = static_cast<int>((keys + kTileKeys - 1) / kTileKeys);
  const int pairs = step.num_seqs * cache.num_kv_heads;
  const int splits = std::max(1, std::min(max_splits, (2 * sm_count + pairs - 1) / pairs));
  const int64_t split_tiles = ((keys + kTileKeys - 1) / kTileKeys + splits - 1) / splits;
  if (splits_out) *splits_out = splits;
  if (split_keys_out) *split_keys_out = static_cast<int>(split_tiles * kTileKeys);
  return size_t(pairs) * splits * rows * (d + 2);
}

cudaError_t launch_draft_block_attention(const StepView& step, const KvLayerView& cache, const uint16_t* q,
                                         int num_q_heads, const uint16_t* block_k, const uint16_t* block_v,
                                         int block_len, int window, float sm_scale, uint16_t* out, float* scratch,
                                         size_t scratch_floats, int sm_count, cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const int group = num_q_heads / cache.num_kv_heads;
  DraftAttnParams a{step, cache, q, num_q_heads, block_k, block_v, block_len, window, sm_scale, out};
  int splits = 0, split_keys = 0;
  const size_t need = draft_attention_scratch_floats(step, cache, num_q_heads, block_len, window, sm_count, &splits,
                                                     &split_keys);
  if (need > 0 && scratch != nullptr && scratch_floats >= need) {
    TiledAttnParams p{a, group, block_len * group, splits, split_keys, nullptr, nullptr};
    const int d = cache.head_dim, rows = p.rows;
    p.part_o = scratch;
    p.part_ml = scratch + size_t(step.num_seqs) * cache.num_kv_heads * splits * rows * d;
    const size_t smem = tiled_smem_bytes(rows, d);
    cudaError_t e = cudaFuncSetAttribute(draft_attention_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    launch_kernel(draft_attention_tiled_kernel, dim3(step.num_seqs, cache.num_kv_heads, splits), kTiledThreads, smem, stream, p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    launch_kernel(draft_attention_merge_kernel, dim3(step.num_tokens, num_q_heads), 128, 0, stream, p);
    return cudaGetLastError();
  }
  if (group > 32 || cache.head_dim > 32 * kMaxChannelsPerLane) return cudaErrorInvalidValue;
  const size_t smem = size_t(group) * (cache.head_dim + 32) * sizeof(float);
  launch_kernel(draft_block_attention_kernel, dim3(step.num_tokens, cache.num_kv_heads), 32 * group, smem, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_markov_drafts(const MarkovDraftArgs& args, cudaStream_t stream) {
  if (args.num_blocks == 0) return cudaSuccess;
  const int64_t rows = int64_t(args.num_blocks) * args.block_len;
  cudaError_t e = cudaMemsetAsync(args.keys, 0, rows * sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return e;
  if (args.rank > kMarkovMaxRank) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((args.vocab + kMarkovRows - 1) / kMarkovRows),
                  static_cast<unsigned>((args.num_blocks + kMarkovReqPerCta - 1) / kMarkovReqPerCta));
  const size_t smem = markov_smem_bytes(args.rank);
  e = cudaFuncSetAttribute(markov_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  for (int j = 0; j < args.block_len; ++j) {
    launch_kernel(markov_step_kernel, grid, kMarkovThreads, smem, stream, args, j);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  launch_kernel(markov_finish_kernel, static_cast<unsigned>(rows), 32, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
