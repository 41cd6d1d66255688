// Top-k block selection from the indexer's block scores (ops/attention.h, docs/reference.md D2).
//
// One CTA per (query token, index head). Forced blocks (the `local_blocks` most recent and the
// first `init_blocks`) are always kept; the remaining k - forced slots go to the highest scores
// among the other visible blocks, ties to the lower block id. Up to kThreads candidates (a
// context of ~32K tokens) each thread ranks one against all the others; beyond, the exact k-th
// largest score is found by a 4-pass radix select (8 bits per pass). Both work on order-preserving
// integer keys, so the result is the exact ordering, not a quantised one. Output: the chosen ids
// in ascending order, then -1 padding.
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopk = 128;

// Larger float -> larger key; -0 and +0 map to the same key (they tie, as floats do).
__device__ __forceinline__ uint32_t order_key(float s) {
  const uint32_t u = __float_as_uint(s + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The selection when the m candidates (blocks init_end .. local_begin - 1, keys[]) fit one a
// thread: candidate i is taken when fewer than `take` candidates come before it in the selection
// order (larger key, then lower id), counted against every other key, so the ties go to the lower
// ids exactly as the radix select's ordered compaction does. Writes the k = init_end + take +
// (n - local_begin) ids in ascending order (the init blocks, the taken candidates by a scan of the
// taken flags, the local blocks), then -1 padding to `topk`. Replaces the radix passes' three
// barriers each (up to four passes) with one loop over the keys and a scan: at decode sizes the
// launch is latency.
__device__ __forceinline__ void select_by_rank(const uint32_t* keys, int m, int take, int init_end, int local_begin,
                                               int n, int32_t* out, int topk, int* warp_sums) {
  const int tid = threadIdx.x;
  bool taken = false;
  if (tid < m) {
    const uint32_t mine = keys[tid];
    int before = 0;
    for (int j = 0; j < m; ++j) {
      const uint32_t other = keys[j];
      before += other > mine || (other == mine && j < tid);
    }
    taken = before < take;
  }
  int total = 0;
  const int slot = block_exclusive_scan(taken ? 1 : 0, warp_sums, total);
  if (taken) out[init_end + slot] = init_end + tid;
  for (int i = tid; i < init_end; i += kThreads) out[i] = i;
  const int k = init_end + take + (n - local_begin);
  for (int i = tid; i < n - local_begin; i += kThreads) out[init_end + take + i] = local_begin + i;
  for (int i = k + tid; i < topk; i += kThreads) out[i] = -1;
}

// Eight CTAs an SM (32 registers): a decode step of many query rows (B=128 with Q=8 is 1,024
// CTAs) then runs in one wave. The rank path alone took the kernel to 40 registers, six CTAs an
// SM, and msa_bench's B=128 decode rows 0.3-3 us slower (docs/msa-kernels-notes.md); at 32 it
// compiles without spills.
__global__ void __launch_bounds__(kThreads, 8) topk_kernel(const TopkArgs a) {
  kernel_prologue();
  extern __shared__ uint32_t keys[];
  __shared__ uint32_t hist[256];
  __shared__ int chosen[kMaxTopk];
  __shared__ int num_chosen;
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_bin_count;
  __shared__ int warp_sums[kThreads / 32];

  const int tid = threadIdx.x;
  const int token = blockIdx.x / a.index_heads, head = blockIdx.x % a.index_heads;
  int32_t* out = a.out + (int64_t(token) * a.index_heads + head) * a.topk;
  const int pos = a.step.positions[token];
  if (pos < 0) {
    for (int i = tid; i < a.topk; i += kThreads) out[i] = -1;
    return;
  }
  const int bs = a.block_size;
  const int local = pos / bs, n = local + 1;
  const int seq_len = a.step.seq_lens[a.step.token_seq[token]];
  const int k = min(a.topk, (seq_len + bs - 1) / bs);
  if (n <= k) {  // every visible block fits
    for (int i = tid; i < a.topk; i += kThreads) out[i] = i < n ? i : -1;
    return;
  }
  // Forced: [0, init_end) and [local_begin, n). Candidates: [init_end, local_begin).
  const int init_end = min(a.init_blocks, n);
  const int local_begin = max(init_end, n - a.local_blocks);
  const int forced = init_end + (n - local_begin);
  if (forced >= k) {  // all slots forced: the lowest ids win the +inf ties
    for (int i = tid; i < a.topk; i += kThreads)
      out[i] = i >= k ? -1 : (i < init_end ? i : local_begin + (i - init_end));
    return;
  }
  const int m = local_begin - init_end;
  const float* scores = a.scores + int64_t(a.score_offset[token]) * a.index_heads +
                        int64_t(head) * n + init_end;
  for (int i = tid; i < m; i += kThreads) keys[i] = order_key(scores[i]);
  if (m <= kThreads) {  // one candidate a thread: select by rank (decode rows up to ~32K tokens)
    __syncthreads();
    select_by_rank(keys, m, k - forced, init_end, local_begin, n, out, a.topk, warp_sums);
    return;
  }
  if (tid == 0) num_chosen = 0;
  for (int i = tid; i < forced; i += kThreads)
    chosen[i] = i < init_end ? i : local_begin + (i - init_end);
  __syncthreads();

  // Radix select of the (k - forced)-th largest key, most significant byte first. Stops early
  // once the bin holding the threshold holds exactly the keys still needed.
  uint32_t prefix = 0u, mask = 0u;
  int remaining = k - forced;  // keys still to take from those matching `prefix` under `mask`
  const int lane = tid & 31;
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[tid] = 0u;
    __syncthreads();
    for (int i = tid; i < m; i += kThreads) {
      const uint32_t key = keys[i];
      if ((key & mask) == prefix) {
        // Scores cluster in few exponent bins: one shared atomic per distinct bin per warp.
        const uint32_t bin = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(__activemask(), bin);
        if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], uint32_t(__popc(peers)));
      }
    }
    __syncthreads();
    if (tid < 32) {
      uint32_t c[8];
      uint32_t sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - 8 * tid - j];
        sum += c[j];
      }
      uint32_t inc = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, inc, o);
        if (tid >= o) inc += v;
      }
      uint32_t cum = inc - sum;  // keys in higher bins than this lane's
      if (cum < uint32_t(remaining) && uint32_t(remaining) <= inc) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum + c[j] >= uint32_t(remaining)) {
            s_prefix = prefix | (uint32_t(255 - 8 * tid - j) << shift);
            s_remaining = remaining - int(cum);
            s_bin_count = int(c[j]);
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    if (s_bin_count == remaining) break;  // every key of the bin is taken
  }
  const int take_equal = remaining;  // keys matching the prefix still to take, lowest ids first

  // Keys above the prefix: all of them (order fixed by the final sort).
  for (int i = tid; i < m; i += kThreads)
    if ((keys[i] & mask) > prefix) chosen[forced + atomicAdd(&num_chosen, 1)] = init_end + i;
  // Keys matching the prefix: ordered compaction over contiguous chunks of ids.
  const int chunk = (m + kThreads - 1) / kThreads;
  const int lo = min(m, tid * chunk), hi = min(m, lo + chunk);
  int eq = 0;
  for (int i = lo; i < hi; ++i) eq += (keys[i] & mask) == prefix;
  int total = 0;
  int rank = block_exclusive_scan(eq, warp_sums, total);
  const int above = k - forced - take_equal;
  for (int i = lo; i < hi && rank < take_equal; ++i)
    if ((keys[i] & mask) == prefix) chosen[forced + above + rank++] = init_end + i;
  __syncthreads();

  // Ascending ids: each id's rank is the number of smaller ids (all distinct).
  if (tid < k) {
    const int id = chosen[tid];
    int r = 0;
    for (int j = 0; j < k; ++j) r += chosen[j] < id;
    out[r] = id;
  }
  for (int i = k + tid; i < a.topk; i += kThreads) out[i] = -1;
}

}  // namespace

cudaError_t init_topk_kernels() {
  return cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
}

cudaError_t launch_topk(const TopkArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  const size_t smem = size_t(a.max_candidates > 0 ? a.max_candidates : 1) * 4;
  launch_kernel(topk_kernel, a.num_tokens * a.index_heads, kThreads, smem, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
