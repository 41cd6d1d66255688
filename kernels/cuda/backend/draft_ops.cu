// The DSpark drafter's two ops (ops/backend.h draft_block_attention, markov_drafts). Simple and
// exact rather than fast, as the generic attention path: every dot product and sum runs in the CPU
// reference's order with fp32 operations that are not contracted.
#include <cstdint>

#include "formats/bf16.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cached_row.cuh"
#include "kernels/cuda/backend/device_math.cuh"

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

__global__ void draft_block_attention_kernel(const DraftAttnParams a) {
  extern __shared__ float draft_buf[];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, g = blockIdx.y, hkv = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
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
  // Key i: a cached context row, or a row of the block (bf16 activations).
  auto row_of = [&](int i, int which, KvDType& dtype) -> const uint8_t* {
    if (i < context) {
      const int p = first + i;
      dtype = c.kv_dtype;
      return c.kv_row(pages[p / bs], which, g, p % bs);
    }
    dtype = KvDType::kBF16;
    const uint16_t* rows = which == 0 ? a.block_k : a.block_v;
    return reinterpret_cast<const uint8_t*>(rows + ((int64_t(s) * a.block_len + (i - context)) * hkv + g) * d);
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

// draft_head_dot's order: eight interleaved lanes, ((0+4)+(2+6))+((1+5)+(3+7)), then the tail.
__device__ __forceinline__ float head_dot(const float* a, const float* b, int n) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const int n8 = n & ~7;
  for (int i = 0; i < n8; i += 8)
#pragma unroll
    for (int l = 0; l < 8; ++l) lane[l] = __fadd_rn(lane[l], __fmul_rn(a[i + l], b[i + l]));
  float acc = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[4]), __fadd_rn(lane[2], lane[6])),
                        __fadd_rn(__fadd_rn(lane[1], lane[5]), __fadd_rn(lane[3], lane[7])));
  for (int i = n8; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(a[i], b[i]));
  return acc;
}

__device__ __forceinline__ int32_t markov_prev(const MarkovDraftArgs& a, int block, int j) {
  const int64_t first_row = int64_t(block) * a.block_len;
  return j == 0 ? a.token_ids[first_row] : argmax_id(a.keys[first_row + j - 1]);
}

constexpr int kMarkovThreads = 256;
constexpr int kMarkovChunk = 4096;  // vocabulary entries per CTA

// grid (vocab chunks, blocks): the best key of each chunk of draft j's adjusted row into keys[row].
__global__ void __launch_bounds__(kMarkovThreads) markov_step_kernel(const MarkovDraftArgs a, int j) {
  extern __shared__ float w1_prev[];  // [rank]
  __shared__ unsigned long long warp_best[kMarkovThreads / 32];
  const int block = blockIdx.y;
  const int64_t row = int64_t(block) * a.block_len + j;
  const int32_t prev = markov_prev(a, block, j);
  for (int i = threadIdx.x; i < a.rank; i += blockDim.x) w1_prev[i] = a.w1[int64_t(prev) * a.rank + i];
  __syncthreads();
  const int64_t begin = int64_t(blockIdx.x) * kMarkovChunk;
  const int64_t end = min(begin + kMarkovChunk, a.vocab);
  unsigned long long best = 0ull;
  for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x) {
    const float logit = __fadd_rn(bf16_decode(a.base[row * a.vocab + v]), head_dot(a.w2 + v * a.rank, w1_prev, a.rank));
    const unsigned long long key = argmax_key(logit, static_cast<int32_t>(v));
    best = key > best ? key : best;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kMarkovThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    atomicMax(a.keys + row, best);
  }
}

// One warp per row: its id, and its confidence (lanes 0..7 sum a residue class each, lane 0 adds
// them in draft_head_dot's order).
__global__ void markov_finish_kernel(const MarkovDraftArgs a) {
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

cudaError_t launch_draft_block_attention(const StepView& step, const KvLayerView& cache, const uint16_t* q,
                                         int num_q_heads, const uint16_t* block_k, const uint16_t* block_v,
                                         int block_len, int window, float sm_scale, uint16_t* out,
                                         cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const int group = num_q_heads / cache.num_kv_heads;
  if (group > 32 || cache.head_dim > 32 * kMaxChannelsPerLane) return cudaErrorInvalidValue;
  DraftAttnParams a{step, cache, q, num_q_heads, block_k, block_v, block_len, window, sm_scale, out};
  const size_t smem = size_t(group) * (cache.head_dim + 32) * sizeof(float);
  draft_block_attention_kernel<<<dim3(step.num_tokens, cache.num_kv_heads), 32 * group, smem, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_markov_drafts(const MarkovDraftArgs& args, cudaStream_t stream) {
  if (args.num_blocks == 0) return cudaSuccess;
  const int64_t rows = int64_t(args.num_blocks) * args.block_len;
  cudaError_t e = cudaMemsetAsync(args.keys, 0, rows * sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((args.vocab + kMarkovChunk - 1) / kMarkovChunk), args.num_blocks);
  for (int j = 0; j < args.block_len; ++j) {
    markov_step_kernel<<<grid, kMarkovThreads, args.rank * sizeof(float), stream>>>(args, j);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  markov_finish_kernel<<<static_cast<unsigned>(rows), 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
