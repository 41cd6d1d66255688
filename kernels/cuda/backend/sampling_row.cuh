// The threads of one logits row for the sampling kernels (sampling.cu): a thread-block cluster of
// kRowCtas CTAs, each over its own span of consecutive ids, so that one row's passes run on
// kRowCtas multiprocessors (a 200K-token row from one SM took ~150 us in the logprobs kernel).
//
// Reductions run in a fixed order, so a row gives the same bits on every run and in every batch:
// a thread's part, warp butterflies, the warps in index order (CTA-level, the block_* functions),
// then the CTAs in rank order (the row_* functions, through distributed shared memory). Values
// derived from a row-level result are computed by every CTA alike, so the CTAs take the same
// branches and reach the same cluster barriers.
//
// An exchange between the CTAs: wait until every CTA has finished reading the previous exchange,
// write this CTA's slot, arrive and wait (the cluster barrier: release, then acquire), read every
// CTA's slot, arrive again to say so. That last arrival's wait comes at the start of the next
// exchange (or at the row's end, row_end), so its latency overlaps the work between exchanges.
// A kernel calls row_begin() first and row_end() last, in every thread.
#pragma once
#include <cooperative_groups.h>

#include <climits>
#include <cstdint>

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kRowCtas = 8;  // a row's CTAs: the portable cluster size
constexpr int kPivots = 7;   // sums exchanged at once (the top_p search's masses)
constexpr int kRadixBins = 2048;
constexpr int kSlotBytes = 64;

struct Shared {
  double dbl[kWarps][kPivots];
  float flt[kWarps];
  int32_t i32[kWarps][2];
  alignas(16) int32_t hist[kRadixBins];  // read by the row's other CTAs during the radix select
  uint32_t u32[2];
  int32_t found[2];
  alignas(16) unsigned char slot[kSlotBytes];                // read by the other CTAs
  alignas(16) unsigned char gathered[kRowCtas * kSlotBytes];  // every CTA's slot, in rank order
};

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// This CTA's part of a row: which row, its rank in the row's cluster and its ids [begin, end)
// (spans of a multiple of 8 ids, so a 16-byte aligned row stays aligned at every span; the last
// CTAs of a short row may have none).
struct RowPart {
  int row;
  int rank;
  int begin;
  int end;
};
__device__ __forceinline__ RowPart row_part(int vocab) {
  RowPart p;
  p.rank = int(cooperative_groups::this_cluster().block_rank());
  p.row = blockIdx.x / kRowCtas;
  const int per = ((vocab + kRowCtas - 1) / kRowCtas + 7) / 8 * 8;
  p.begin = min(vocab, p.rank * per);
  p.end = min(vocab, p.begin + per);
  return p;
}

// barrier.cluster.arrive has release and barrier.cluster.wait acquire semantics by default: what a
// thread wrote (shared or global) before arriving is visible to every thread past the wait, and
// its loads before arriving are done before anything after another CTA's wait.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;\n" ::: "memory"); }

// The first arrival: nothing read yet (the first exchange's wait also makes sure that every CTA
// of the cluster runs before any reads another's shared memory).
__device__ __forceinline__ void row_begin() { cluster_arrive(); }
// The last wait: no CTA leaves while another may still read its shared memory.
__device__ __forceinline__ void row_end() { cluster_wait(); }

// Every CTA's `mine` (the same value in each of its threads), in rank order; read_more(all) runs
// after the slots are read and before this CTA says it is done reading, for reads of the other
// CTAs' shared memory beyond the slot. The result stays valid until the next exchange.
template <class T, class ReadMore>
__device__ const T* exchange(const T& mine, Shared& sh, const ReadMore& read_more) {
  static_assert(sizeof(T) <= kSlotBytes, "exchange slot too small");
  auto cluster = cooperative_groups::this_cluster();
  T* slot = reinterpret_cast<T*>(sh.slot);
  T* all = reinterpret_cast<T*>(sh.gathered);
  cluster_wait();  // every CTA has read the previous exchange
  if (threadIdx.x == 0) *slot = mine;
  cluster_arrive();
  cluster_wait();
  if (threadIdx.x < kRowCtas) all[threadIdx.x] = *cluster.map_shared_rank(slot, int(threadIdx.x));
  __syncthreads();
  read_more(static_cast<const T*>(all));
  cluster_arrive();
  __syncthreads();  // what read_more wrote, for every thread of the CTA
  return all;
}
template <class T>
__device__ const T* exchange(const T& mine, Shared& sh) {
  return exchange(mine, sh, [](const T*) {});
}

// ---- CTA-level reductions (the same bits in every thread of the CTA) ----

template <class T>
__device__ T block_sum(T v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane_id() == 0) {
    if constexpr (sizeof(T) == 8) sh.dbl[warp_id()][0] = v;
    else sh.i32[warp_id()][0] = v;
  }
  __syncthreads();
  T r = 0;
  for (int w = 0; w < kWarps; ++w) {
    if constexpr (sizeof(T) == 8) r += sh.dbl[w][0];
    else r += sh.i32[w][0];
  }
  return r;
}

__device__ float block_max(float v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  __syncthreads();
  if (lane_id() == 0) sh.flt[warp_id()] = v;
  __syncthreads();
  float r = sh.flt[0];
  for (int w = 1; w < kWarps; ++w) r = sh.flt[w] > r ? sh.flt[w] : r;
  return r;
}

// min (or max) of an int over the CTA.
__device__ int32_t block_min_max(int32_t v, bool take_max, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int32_t other = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? max(v, other) : min(v, other);
  }
  __syncthreads();
  if (lane_id() == 0) sh.i32[warp_id()][1] = v;
  __syncthreads();
  int32_t r = sh.i32[0][1];
  for (int w = 1; w < kWarps; ++w) r = take_max ? max(r, sh.i32[w][1]) : min(r, sh.i32[w][1]);
  return r;
}

// Exclusive prefix over the CTA's threads in index order; total = the CTA's sum.
template <class T>
__device__ T block_exclusive_scan(T v, T& total, Shared& sh) {
  T incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane_id() >= o) incl += n;
  }
  T excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane_id() == 0) excl = 0;
  __syncthreads();
  if (lane_id() == 31) {
    if constexpr (sizeof(T) == 8) sh.dbl[warp_id()][0] = incl;
    else sh.i32[warp_id()][0] = incl;
  }
  __syncthreads();
  T warp_prefix = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp_id()) warp_prefix = sum;
    if constexpr (sizeof(T) == 8) sum += sh.dbl[w][0];
    else sum += sh.i32[w][0];
  }
  total = sum;
  return warp_prefix + excl;
}

// ---- Row-level reductions (the same bits in every thread of the row) ----

template <class T>
__device__ T row_sum(T v, Shared& sh) {
  const T* all = exchange(block_sum(v, sh), sh);
  T r = 0;
  for (int c = 0; c < kRowCtas; ++c) r += all[c];
  return r;
}

struct Sums {
  double v[kPivots];
};
// kPivots sums at once.
__device__ void row_sums(double (&v)[kPivots], Shared& sh) {
#pragma unroll
  for (int j = 0; j < kPivots; ++j)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
  __syncthreads();
  if (lane_id() == 0)
    for (int j = 0; j < kPivots; ++j) sh.dbl[warp_id()][j] = v[j];
  __syncthreads();
  Sums cta;
  for (int j = 0; j < kPivots; ++j) {
    double r = 0;
    for (int w = 0; w < kWarps; ++w) r += sh.dbl[w][j];
    cta.v[j] = r;
  }
  const Sums* all = exchange(cta, sh);
  for (int j = 0; j < kPivots; ++j) {
    double r = 0;
    for (int c = 0; c < kRowCtas; ++c) r += all[c].v[j];
    v[j] = r;
  }
}

__device__ float row_max(float v, Shared& sh) {
  const float* all = exchange(block_max(v, sh), sh);
  float r = all[0];
  for (int c = 1; c < kRowCtas; ++c) r = all[c] > r ? all[c] : r;
  return r;
}

// First id of the row's largest value (NaN never wins); 0 when nothing is larger than -inf.
// visit(f) hands f(id, value) each of this CTA's values, in any order.
struct ArgMax {
  float value;
  int32_t id;
};
template <class Visit>
__device__ int32_t row_argmax(const Visit& visit, Shared& sh) {
  float best = -INFINITY;
  int32_t best_id = INT_MAX;
  visit([&](int i, float x) {
    if (x > best || (x == best && i < best_id)) {
      best = x;
      best_id = i;
    }
  });
  ArgMax cta;
  cta.value = block_max(best, sh);
  cta.id = block_min_max(best == cta.value ? best_id : INT_MAX, false, sh);
  const ArgMax* all = exchange(cta, sh);
  float m = all[0].value;
  for (int c = 1; c < kRowCtas; ++c) m = all[c].value > m ? all[c].value : m;
  if (!(m > -INFINITY)) return 0;
  int32_t id = INT_MAX;
  for (int c = 0; c < kRowCtas; ++c)
    if (all[c].value == m) id = min(id, all[c].id);
  return id;
}

// The k-th largest of the row's keys (1 <= k <= the row's length), counting repeats: each CTA
// hands its span's keys (below 2^kKeyBits) to f through visit_keys(f). `ties_in`: how many keys
// equal to it are among the k largest (k minus the count of larger keys); `ties_total`: how many
// keys equal it. Digits of 11 bits from the top (32-bit keys: 11/11/10; 16-bit keys: 11/5), one
// pass over the span each; each CTA counts its keys into its histogram, every CTA sums the row's
// histograms and finds the digit alike.
template <int kKeyBits, class VisitKeys>
__device__ uint32_t row_select_kth(const VisitKeys& visit_keys, int k, int& ties_in, int& ties_total, Shared& sh) {
  static_assert(kKeyBits > 11 && kKeyBits <= 32, "keys of 12 to 32 bits");
  constexpr int kPasses = (kKeyBits + 10) / 11;
  auto cluster = cooperative_groups::this_cluster();
  uint32_t prefix = 0;
  int remaining = k;
  for (int pass = 0; pass < kPasses; ++pass) {
    constexpr int kWidths[3] = {11, kPasses == 2 ? kKeyBits - 11 : 11, kPasses == 3 ? kKeyBits - 22 : 0};
    constexpr int kShifts[3] = {kKeyBits - 11, kPasses == 2 ? 0 : kKeyBits - 22, 0};
    const int width = kWidths[pass];
    const int shift = kShifts[pass];
    const int bins = 1 << width;
    const uint32_t high_mask = pass == 0 ? 0u : ~0u << (shift + width);
    cluster_wait();  // every CTA has read this CTA's histogram of the pass before
    for (int b = threadIdx.x; b < bins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    visit_keys([&](uint32_t key) {
      if ((key & high_mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & (bins - 1)], 1);
    });
    cluster_arrive();
    cluster_wait();
    // Thread t owns `per` consecutive bins counted from the top (bins - (t + 1) * per up to
    // bins - t * per - 1; none where that runs below 0), summed over the row's CTAs: one load of
    // up to 16 bytes from each CTA, all eight in flight at once.
    constexpr int kMaxPer = kRadixBins / kThreads;
    static_assert(kMaxPer == 4, "a thread's bins are at most one int4 of each histogram");
    // Only a last digit of fewer than 10 bits has fewer than two bins a thread (32-bit keys have
    // none, and compile without the branch).
    constexpr bool kNarrowLast = kKeyBits - 11 * (kPasses - 1) < 10;
    const bool narrow = kNarrowLast && pass == kPasses - 1;
    const int per = narrow ? 1 : bins / kThreads;
    const int first = bins - (int(threadIdx.x) + 1) * per;
    int4 part[kRowCtas];
#pragma unroll
    for (int c = 0; c < kRowCtas; ++c) {
      const int32_t* h = cluster.map_shared_rank(&sh.hist[0], c);
      if (narrow) {
        part[c] = make_int4(first >= 0 ? h[first] : 0, 0, 0, 0);
      } else if (per == 4) {
        part[c] = *reinterpret_cast<const int4*>(h + first);
      } else {
        const int2 v = *reinterpret_cast<const int2*>(h + first);
        part[c] = make_int4(v.x, v.y, 0, 0);
      }
    }
    int total_of[kMaxPer];  // total_of[j]: bin bins - 1 - (t * per + j)
    int own = 0;
#pragma unroll
    for (int j = 0; j < kMaxPer; ++j) {
      total_of[j] = 0;
#pragma unroll
      for (int c = 0; c < kRowCtas; ++c) {
        const int4 v = part[c];
        const int at = per - 1 - j;  // the bin's place in the thread's run
        total_of[j] += j >= per ? 0 : at == 0 ? v.x : at == 1 ? v.y : at == 2 ? v.z : v.w;
      }
      own += total_of[j];
    }
    int total;
    const int above = block_exclusive_scan(own, total, sh);
    if (above < remaining && above + own >= remaining) {
      int seen = above;
#pragma unroll
      for (int j = 0; j < kMaxPer; ++j) {
        if (j >= per) break;
        if (seen + total_of[j] >= remaining) {
          sh.u32[0] = uint32_t(bins - 1 - (threadIdx.x * per + j));
          sh.found[0] = remaining - seen;
          sh.found[1] = total_of[j];
          break;
        }
        seen += total_of[j];
      }
    }
    __syncthreads();
    cluster_arrive();
    prefix |= sh.u32[0] << shift;
    remaining = sh.found[0];
    ties_total = sh.found[1];
    __syncthreads();  // sh.u32 and sh.found are read before they are written again
  }
  ties_in = remaining;
  return prefix;
}

}  // namespace
}  // namespace m3::cuda::detail
