// Indexer decode context parallelism on the device (ops/attention.h "Indexer DCP"): the candidates
// of one rank's block slice and the merge of every rank's candidates, bit for bit the CPU
// reference's (kernels/cpu/indexer_dcp.cc): the same decode, the same dot order without
// contraction, the same max, the same packed keys (ops/attention.h).
//
// Straightforward rather than fast: one CTA per (token, head) scans its slice warp by warp (one
// key row per lane, a whole dot per lane) and picks the top k by k rounds of a block-wide argmax.
// The fast path (tensor-core scores over the slice, as kernels/cuda/indexer.cu does for the whole
// range, and a one-pass top-k) can come later; its scores differ from the reference in the last
// bits, which keeps DCP exact against indexer_topk on the same kernels but not against the CPU.
#include <cstdint>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cached_row.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The largest of `v` over the CTA with its index (-1 when every v is 0: nothing left). Non-zero
// keys are distinct, so ties happen among zeros only; red: kWarps slots of shared scratch.
__device__ __forceinline__ int64_t block_argmax(int64_t v, int i, int& best_i, int64_t* red_v, int* red_i) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int64_t ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
  if (lane == 0) red_v[warp] = v, red_i[warp] = i;
  __syncthreads();
  v = red_v[0], i = red_i[0];
  for (int w = 1; w < kWarps; ++w)
    if (red_v[w] > v || (red_v[w] == v && red_i[w] < i)) v = red_v[w], i = red_i[w];
  __syncthreads();  // red is reused by the next round
  best_i = v != 0 ? i : -1;
  return v;
}

struct CandidateArgs {
  StepView step;
  KvLayerView cache;
  const uint16_t* index_q_parts;  // [parts * T, Hl * Di] bf16
  int parts, cp_size, cp_rank;
  IndexerParams params;
  int64_t* candidates;  // [parts, T, Hl, topk]
};

// Grid (T, parts * Hl). Shared: the query [Di] fp32, the slice's scores [ceil(max_blocks / cp)].
__global__ void __launch_bounds__(kThreads) candidates_kernel(const CandidateArgs a) {
  kernel_prologue();
  extern __shared__ float dcp_buf[];
  __shared__ int64_t red_v[kWarps];
  __shared__ int red_i[kWarps];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, g = blockIdx.y, hl = a.params.index_heads, di = c.index_dim, bs = c.block_size;
  const int p = g / hl, h = g % hl, tokens = a.step.num_tokens, topk = a.params.topk_blocks;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* q = dcp_buf;
  float* score = dcp_buf + di;
  const int pos = a.step.positions[t], seq = a.step.token_seq[t];
  const int32_t* pages = a.step.page_table + int64_t(seq) * a.step.pages_per_seq;
  const int local = pos / bs;
  const int mine = local >= a.cp_rank ? (local - a.cp_rank) / a.cp_size + 1 : 0;
  const bool q8 = e4m3_queries(c.index_dtype);
  for (int i = threadIdx.x; i < di; i += kThreads) {
    const float x = bf16_decode(a.index_q_parts[((int64_t(p) * tokens + t) * hl + h) * di + i]);
    q[i] = q8 ? fp8_e4m3_round(x) : x;
  }
  __syncthreads();
  // Block i of the slice is b = cp_rank + i * cp_size; its score as cpu_indexer_block_scores: the
  // max from -inf over its visible rows (std::max's comparison: a NaN dot changes nothing; which
  // zero survives does not matter, the key reads -0 as +0).
  for (int i = warp; i < mine; i += kWarps) {
    const int b = a.cp_rank + i * a.cp_size;
    const int64_t phys = pages[b];
    const int rows = min(bs, pos - b * bs + 1);
    float m = -INFINITY;
    for (int r = lane; r < rows; r += 32) {
      const float d = reference_dot(q, c.index_dtype, c.index_row(phys, r), c.index_row_scales(phys, r), di, true);
      if (m < d) m = d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, m, o);
      if (m < om) m = om;
    }
    if (lane == 0) score[i] = indexer_forced_block(b, local, a.params) ? INFINITY : m;
  }
  __syncthreads();
  const int seq_blocks = (a.step.seq_lens[seq] + bs - 1) / bs;
  const int n = min(min(topk, seq_blocks), mine);
  int64_t* out = a.candidates + ((int64_t(p) * tokens + t) * hl + h) * topk;
  int written = 0;
  for (; written < n; ++written) {
    int64_t best = 0;
    int best_i = -1;
    for (int i = threadIdx.x; i < mine; i += kThreads) {
      const int64_t key = indexer_candidate_key(score[i], a.cp_rank + i * a.cp_size);
      if (key > best) best = key, best_i = i;
    }
    best = block_argmax(best, best_i, best_i, red_v, red_i);
    if (best == 0) break;  // the rest have no visible key
    if (threadIdx.x == 0) {
      out[written] = best;
      score[best_i] = -INFINITY;  // key 0 from now on
    }
    __syncthreads();
  }
  for (int i = written + threadIdx.x; i < topk; i += kThreads) out[i] = 0;
}

struct MergeArgs {
  StepView step;
  const int64_t* gathered;  // [cp_size, parts, T, Hl, topk]
  int cp_size, parts, part;
  IndexerParams params;
  int32_t* selection;  // [T, Hl, topk]
};

// Grid (T, Hl). Shared: the cp_size * topk keys, then the chosen ids [topk].
__global__ void __launch_bounds__(kThreads) merge_kernel(const MergeArgs a) {
  kernel_prologue();
  extern __shared__ int64_t merge_buf[];
  __shared__ int64_t red_v[kWarps];
  __shared__ int red_i[kWarps];
  const int t = blockIdx.x, h = blockIdx.y, hl = a.params.index_heads, topk = a.params.topk_blocks;
  const int tokens = a.step.num_tokens, total = a.cp_size * topk;
  int64_t* keys = merge_buf;
  int32_t* chosen = reinterpret_cast<int32_t*>(merge_buf + total);
  for (int j = threadIdx.x; j < total; j += kThreads) {
    const int r = j / topk, i = j % topk;
    keys[j] = a.gathered[(((int64_t(r) * a.parts + a.part) * tokens + t) * hl + h) * topk + i];
  }
  __syncthreads();
  // k is implied by the keys (kernels/cpu/indexer_dcp.cc): the topk largest non-zero ones.
  int n = 0;
  for (; n < topk; ++n) {
    int64_t best = 0;
    int best_j = -1;
    for (int j = threadIdx.x; j < total; j += kThreads)
      if (keys[j] > best) best = keys[j], best_j = j;
    best = block_argmax(best, best_j, best_j, red_v, red_i);
    if (best == 0) break;
    if (threadIdx.x == 0) {
      chosen[n] = indexer_candidate_block(best);
      keys[best_j] = 0;
    }
    __syncthreads();
  }
  __syncthreads();
  // Ascending ids: each goes to its rank among the chosen (ties, only from repeated keys in a
  // malformed input, by position, as a stable sort would place them).
  int32_t* out = a.selection + (int64_t(t) * hl + h) * topk;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int32_t id = chosen[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += chosen[j] < id || (chosen[j] == id && j < i);
    out[rank] = id;
  }
  for (int i = n + threadIdx.x; i < topk; i += kThreads) out[i] = -1;
}

// Dynamic shared memory past the default 48 KiB needs the kernel's opt-in, up to the device's.
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0, limit = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;
  if (bytes > size_t(limit)) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace

cudaError_t launch_indexer_topk_candidates(const StepView& step, const KvLayerView& cache,
                                           const uint16_t* index_q_parts, int parts, const IndexerParams& params,
                                           int cp_size, int cp_rank, int64_t* candidates, cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const int slice = (step.max_blocks + cp_size - 1) / cp_size;
  const size_t smem = (size_t(cache.index_dim) + size_t(slice)) * sizeof(float);
  if (cudaError_t e = allow_smem(candidates_kernel, smem); e != cudaSuccess) return e;
  const CandidateArgs a{step, cache, index_q_parts, parts, cp_size, cp_rank, params, candidates};
  launch_kernel(candidates_kernel, dim3(step.num_tokens, parts * params.index_heads), kThreads, smem, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_merge_topk_candidates(const StepView& step, const int64_t* gathered, int cp_size, int parts,
                                         int part, const IndexerParams& params, int32_t* selection,
                                         cudaStream_t stream) {
  if (step.num_tokens == 0) return cudaSuccess;
  const size_t smem = size_t(cp_size) * params.topk_blocks * sizeof(int64_t) + size_t(params.topk_blocks) * 4;
  if (cudaError_t e = allow_smem(merge_kernel, smem); e != cudaSuccess) return e;
  const MergeArgs a{step, gathered, cp_size, parts, part, params, selection};
  launch_kernel(merge_kernel, dim3(step.num_tokens, params.index_heads), kThreads, smem, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
