// The union of a row group's selected blocks: what a sparse attention CTA of 2-4 rows of one
// sequence walks so that a block several rows selected is read (and decoded) once. Used by
// attention.cu's group walk and sparse_groups.cu's (NVFP4 cache, wgmma).
#pragma once
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {

// Ascending sort of n (a power of two <= kMaxGroupCandidates) keys in shared memory by the CTA.
template <int kThreads>
__device__ __forceinline__ void block_bitonic_sort(int* keys, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool up = (lo & size) == 0;
        const int a = keys[lo], b = keys[hi];
        if ((a > b) == up) keys[lo] = b, keys[hi] = a;
      }
    }
  __syncthreads();
}

// Shared-memory lists of a group's union (each kMaxGroupCandidates ints, tiles
// kMaxGroupCandidates * kMaxTilesPerBlock).
struct GroupUnionLists {
  int* block;  // union entry u: its logical block (the sorted candidate keys before that)
  int* phys;   // its physical block
  int* rows;   // the mask of the group's rows that selected it
  int* tiles;  // the part's tiles: u << 2 | tile in block, ascending (the candidates before that)
};

// How many of the n ascending keys at `keys` are below `key`.
__device__ __forceinline__ int count_below(const int* keys, int n, int key) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (keys[mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Builds the union of the selected, visible blocks of rows [w.row, + w.row_count) for KV head
// w.kv_head, sorted by block, and decides whether the group walks it together: only when the rows
// share enough, n_valid * kShareDen > n_union * kShareNum (n_valid: the rows' visible selected
// blocks counted per row). If they do, the lists hold part w.begin of w.end of the union and its
// tiles (a block's tiles up to the last visible key of the latest row that selected it), and
// *num_tiles their count. Returns the decision to every thread (ends with a barrier).
template <int kThreads, int kShareNum, int kShareDen>
__device__ bool build_group_union(const AttentionArgs& a, const SparseWork& w, const int32_t* pages,
                                  const GroupUnionLists& l, int* num_tiles, int* shared_flag) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hkv = a.cache.num_kv_heads, bs = a.cache.block_size, tiles_per_block = bs / kTileTokens;
  const int row0 = w.row, nrows = w.row_count, kv = w.kv_head;
  // Candidates (block << 2 | row) of the rows' visible selected blocks, sorted: equal blocks
  // become runs of at most 4 keys, one per row that selected the block.
  constexpr int kNone = 0x7fffffff;
  const int topk = a.topk, n_cand = nrows * topk;
  int n_sort = 2;
  while (n_sort < n_cand) n_sort <<= 1;
  int* const keys = l.tiles;  // row r's candidates at r * topk, in selection order
  int* const cand = l.block;  // all of them sorted
  for (int c = tid; c < n_cand; c += kThreads) {
    const int r = c / topk, j = c % topk;
    const int b = a.selection[(int64_t(row0 + r) * hkv + kv) * topk + j];
    keys[c] = b >= 0 && b * bs <= a.step.positions[row0 + r] ? b << 2 | r : kNone;
  }
  __syncthreads();
  // The top-k lists a row's ids ascending, then -1 (so its visible keys ascending, then kNone):
  // then the rows merge, each key placed by counting the other rows' keys below it, and the
  // sort's 21 barrier stages (64 candidates) become one. Selections in another order (the
  // attention op does not require one) take the sort.
  bool unsorted = false;
  for (int c = tid; c < n_cand; c += kThreads)
    unsorted |= c % topk > 0 && keys[c] != kNone && keys[c - 1] >= keys[c];
  if (__syncthreads_or(unsorted)) {
    for (int c = tid; c < n_sort; c += kThreads) cand[c] = c < n_cand ? keys[c] : kNone;
    block_bitonic_sort<kThreads>(cand, n_sort);
  } else {
    for (int c = tid; c < n_sort; c += kThreads) {
      if (c >= n_cand) {
        cand[c] = kNone;
        continue;
      }
      const int r = c / topk, j = c % topk, key = keys[c];
      int at = j;
      if (key != kNone) {  // keys of different rows differ in their row bits: no ties
        for (int r2 = 0; r2 < nrows; ++r2)
          if (r2 != r) at += count_below(keys + r2 * topk, topk, key);
      } else {  // after every visible key, in (row, slot) order: j + r topk + the later rows' keys
        at += r * topk;
        for (int r2 = r + 1; r2 < nrows; ++r2) at += count_below(keys + r2 * topk, topk, kNone);
      }
      cand[at] = key;
    }
    __syncthreads();
  }
  if (warp == 0) {
    // The union in ascending block order: run heads keep their block and the OR of the run's
    // rows; the warp compacts them 32 candidates at a time.
    int n_union = 0, n_valid = 0;
    for (int c0 = 0; c0 < n_sort; c0 += 32) {
      const int c = c0 + lane;
      const int key = c < n_sort ? cand[c] : kNone;
      const bool head = key != kNone && (c == 0 || (cand[c - 1] >> 2) != (key >> 2));
      int mask = 0;
      if (head)
        for (int k = c; k < n_sort && k < c + kSparseGroupRows && (cand[k] >> 2) == (key >> 2); ++k)
          mask |= 1 << (cand[k] & 3);
      int total;
      const int at = n_union + warp_exclusive_scan(head ? 1 : 0, total);
      n_valid += __popc(__ballot_sync(0xffffffffu, key != kNone));
      if (head) {
        l.rows[at] = mask;
        l.phys[at] = key >> 2;  // block id for now
      }
      n_union += total;
    }
    __syncwarp();
    const bool shared = n_valid * kShareDen > n_union * kShareNum;
    if (shared) {
      const int u_begin = int(int64_t(n_union) * w.begin / w.end), u_end = int(int64_t(n_union) * (w.begin + 1) / w.end);
      int n_tiles = 0;
      for (int u0 = u_begin; u0 < u_end; u0 += 32) {
        const int u = u0 + lane;
        int count = 0;
        if (u < u_end) {
          const int b = l.phys[u];
          const int last_row = 31 - __clz(l.rows[u]);
          count = min(tiles_per_block, (a.step.positions[row0 + last_row] - b * bs) / kTileTokens + 1);
          l.block[u] = b;
          l.phys[u] = pages[b];
        }
        int total;
        const int at = n_tiles + warp_exclusive_scan(count, total);
        for (int h = 0; h < count; ++h) l.tiles[at + h] = u << 2 | h;
        n_tiles += total;
      }
      if (lane == 0) *num_tiles = n_tiles;
    }
    if (lane == 0) *shared_flag = shared;
  }
  __syncthreads();
  return *shared_flag != 0;
}

}  // namespace m3::cuda::detail
