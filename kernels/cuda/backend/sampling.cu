// Sampling on the GPU: ops/sampling.h's semantics, one CTA per row, no sort.
//
// Per row (vocab ~200K, read from the bf16 logits as the head wrote them):
//   mask + penalties   into an fp32 copy of the row (only rows that have them; the structured-output
//                      bitmask of a constrained row sets every token it leaves out to -inf)
//   greedy             block argmax, lowest id on ties
//   max                of the tempered row; non-finite -> argmax of the raw row (as the reference)
//   min_p              a value threshold: the smallest float v with exp(v - max) >= min_p, found by
//                      one thread's binary search over the float order (exp is monotone)
//   top_k              the k-th largest value by radix select on order-preserving keys (11/11/10
//                      bit digits, shared-memory histograms); ties with it are kept
//   top_p              vLLM's rule without sorting: the cut value v_c is the smallest value whose
//                      ascending cumulative mass exceeds (1 - top_p) * total, found by a search
//                      over the keys (7 pivots per pass, masses in double); below v_c everything
//                      is dropped, above kept, and of the tokens tied at v_c the highest ids go
//                      first (the reference's ascending order breaks ties by descending id)
//   draw               inverse CDF in token-id order: blocked prefix sums in double, the first id
//                      whose cumulative mass exceeds u * kept mass, u = counter_uniform(seed, index)
//   small set          when min_p and top_k leave <= 1024 candidates: top_p and the draw over them in
//                      shared memory (draw_small_set) instead of the top_p search and draw passes
// Logprobs (logprobs_kernel, after the draw, one CTA per LogprobRow of the raw bf16 row):
//   max and sum of expf(x - max) in one pass (a thread's sum rescaled when its max grows, then
//   the threads' sums to the row's max), in double, with the asked tokens' ranks (counts of larger
//   logits); log_norm = max + log(sum), so a logprob differs from the reference's (exp in double)
//   by the float exps' rounding, ~1e-6 at most; 16-byte loads, 4 in flight
//   top k              the same radix select gives the k-th largest key (NaN keyed below -inf) and
//                      how many tie with it; the larger keys are gathered in any order, the ties
//                      too when all are in, else in id order (a scan of tie counts), and one thread
//                      sorts the <= 20 (key descending, id ascending)
// Every reduction has a fixed order (warp butterflies, then warps in index order; no float
// atomics), so a row gives the same id on every run. Against the host reference the sums differ in
// association only: a different id needs the draw (or the top_p cut, or a min_p test) within
// ~1e-12 of a boundary; backend_check's `sampling` group checks exactly that.
#include <cmath>
#include <climits>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 8;    // consecutive elements per thread in the draw's scan
constexpr int kPivots = 7;   // top_p search: 8 sub-ranges per pass
constexpr int kRadixBins = 2048;

// Order-preserving key of a float (-0 counts as +0: equal values, equal keys).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(__fadd_rn(f, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Shared {
  double dbl[kWarps][kPivots];
  float flt[kWarps];
  int32_t i32[kWarps][2];
  int32_t hist[kRadixBins];
  uint32_t u32[2];
  int32_t found[2];
};

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// Sum over the block, same bits in every thread and on every run.
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

// kPivots sums at once.
__device__ void block_sums(double (&v)[kPivots], Shared& sh) {
#pragma unroll
  for (int j = 0; j < kPivots; ++j)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
  __syncthreads();
  if (lane_id() == 0)
    for (int j = 0; j < kPivots; ++j) sh.dbl[warp_id()][j] = v[j];
  __syncthreads();
  for (int j = 0; j < kPivots; ++j) {
    double r = 0;
    for (int w = 0; w < kWarps; ++w) r += sh.dbl[w][j];
    v[j] = r;
  }
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

// min (or max) of an int over the block.
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

// Exclusive prefix over threads in index order; total = the block's sum. Fixed association.
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

// First index of the largest value (NaN never wins); 0 when nothing is larger than -inf.
template <class Load>
__device__ int32_t block_argmax(const Load& load, int vocab, Shared& sh) {
  float best = -INFINITY;
  int32_t best_id = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = load(i);
    if (x > best) {
      best = x;
      best_id = i;
    }
  }
  const float m = block_max(best, sh);
  if (!(m > -INFINITY)) return 0;
  return block_min_max(best == m ? best_id : INT_MAX, false, sh);
}

// The k-th largest of the keys visit_keys(f) hands f (each thread its share of the row), counting
// repeats (1 <= k <= the row's length); `ties_in`: how many of the keys equal to it are among the k
// largest (k minus the count of larger keys).
// `ties_total`: how many keys equal it.
template <class VisitKeys>
__device__ uint32_t radix_select_kth(const VisitKeys& visit_keys, int k, int& ties_in, int& ties_total, Shared& sh) {
  uint32_t prefix = 0;
  int remaining = k;
  const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = shifts[pass], bins = 1 << widths[pass];
    const uint32_t high_mask = pass == 0 ? 0u : ~0u << (shift + widths[pass]);
    for (int b = threadIdx.x; b < bins; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    visit_keys([&](uint32_t key) {
      if ((key & high_mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & (bins - 1)], 1);
    });
    __syncthreads();
    // Thread t owns bins_per consecutive bins counted from the top.
    const int per = bins / kThreads;
    int own = 0;
    for (int j = 0; j < per; ++j) own += sh.hist[bins - 1 - (threadIdx.x * per + j)];
    int total;
    const int above = block_exclusive_scan(own, total, sh);
    if (above < remaining && above + own >= remaining) {
      int c = above;
      for (int j = 0; j < per; ++j) {
        const int b = bins - 1 - (threadIdx.x * per + j);
        if (c + sh.hist[b] >= remaining) {
          sh.u32[0] = uint32_t(b);
          sh.found[0] = remaining - c;
          sh.found[1] = sh.hist[b];
          break;
        }
        c += sh.hist[b];
      }
    }
    __syncthreads();
    prefix |= sh.u32[0] << shift;
    remaining = sh.found[0];
    __syncthreads();
  }
  ties_in = remaining;
  ties_total = sh.found[1];  // the last pass's bin: every bit of the key fixed
  return prefix;
}

__device__ __forceinline__ void penalise(float* w, int32_t id, int vocab, float r) {
  if (id < 0 || id >= vocab) return;
  const float x = w[id];
  w[id] = x > 0.0f ? __fdiv_rn(x, r) : __fmul_rn(x, r);
}

__device__ bool sorted_contains(const int32_t* list, int n, int32_t id) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (list[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && list[lo] == id;
}

// The reference's mask and penalties, in its order, on the fp32 copy w of the row.
__device__ void mask_and_penalise(const SampleArgs& a, const SampleRow& r, float* w, const uint16_t* raw) {
  const int vocab = a.vocab;
  const uint32_t* allowed = r.allowed_row >= 0 ? a.allowed + int64_t(r.allowed_row) * a.allowed_words : nullptr;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const bool ok = !allowed || ((allowed[i >> 5] >> (i & 31)) & 1u);
    w[i] = ok ? bf16_bits_to_f32(raw[i]) : -INFINITY;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < r.num_masked; i += kThreads) {
    const int32_t id = a.ids[r.masked_begin + i];
    if (id >= 0 && id < vocab) w[id] = -INFINITY;
  }
  __syncthreads();
  // The bias ids are distinct (SampleBatch::add), so no two threads add to one logit.
  for (int i = threadIdx.x; i < r.num_bias; i += kThreads) {
    const int32_t id = a.ids[r.bias_begin + i];
    if (id >= 0 && id < vocab) w[id] = __fadd_rn(w[id], a.biases[r.bias_begin + i]);
  }
  __syncthreads();
  const int32_t* prompt = a.ids + r.prompt_begin;
  if (r.repetition_penalty != 1.0f) {
    for (int i = threadIdx.x; i < r.num_prompt; i += kThreads) penalise(w, prompt[i], vocab, r.repetition_penalty);
    __syncthreads();
    for (int i = threadIdx.x; i < r.num_output; i += kThreads) {
      const int32_t id = a.ids[r.output_begin + i];
      if (!sorted_contains(prompt, r.num_prompt, id)) penalise(w, id, vocab, r.repetition_penalty);
    }
    __syncthreads();
  }
  if (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f) {
    for (int i = threadIdx.x; i < r.num_output; i += kThreads) {
      const int32_t id = a.ids[r.output_begin + i], count = a.counts[r.output_begin + i];
      if (id < 0 || id >= vocab || count <= 0) continue;
      w[id] = __fsub_rn(w[id], __fadd_rn(__fmul_rn(r.frequency_penalty, static_cast<float>(count)), r.presence_penalty));
    }
  }
  __syncthreads();
}

// At most kSmallSet candidates left after min_p and top_k (the usual top_k of 20-100): gathered
// into shared memory and put in id order, then top_p and the draw run there, with the rules of the
// full-row path below, instead of its passes over the row (a top_p search of up to 11 passes and a
// draw that scans the row). The masses are the same exps; only their sums' association differs.
constexpr int kSmallSet = 1024;
struct SmallSet {
  int32_t any_id[kSmallSet];  // gathered, in any order
  float any_x[kSmallSet];
  int32_t id[kSmallSet];      // in id order
  float x[kSmallSet];
  double p[kSmallSet];        // exp(x - max)
  double kept[kSmallSet];     // p, or 0 when top_p drops it
  int count;
};

template <class Tempered, class Candidate, class Prob>
__device__ int32_t draw_small_set(const SampleRow& r, int vocab, const Tempered& tempered, const Candidate& candidate,
                                  const Prob& prob, SmallSet& ss, Shared& sh) {
  if (threadIdx.x == 0) ss.count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = tempered(i);
    if (!candidate(x, order_key(x))) continue;
    const int slot = atomicAdd(&ss.count, 1);
    if (slot < kSmallSet) {
      ss.any_id[slot] = i;
      ss.any_x[slot] = x;
    }
  }
  __syncthreads();
  const int n = min(ss.count, kSmallSet);
  for (int e = threadIdx.x; e < n; e += kThreads) {  // ids are distinct: rank = how many are lower
    const int32_t id = ss.any_id[e];
    int rank = 0;
    for (int f = 0; f < n; ++f) rank += ss.any_id[f] < id;
    ss.id[rank] = id;
    ss.x[rank] = ss.any_x[e];
    ss.p[rank] = prob(ss.any_x[e]);
  }
  __syncthreads();
  double total = 0.0;
  for (int e = threadIdx.x; e < n; e += kThreads) total += ss.p[e];
  total = block_sum(total, sh);
  // top_p: walking up from the least likely (key ascending, ties by descending id), drop while the
  // mass walked, this one included, stays <= (1 - top_p) * total; the most likely always stays.
  const double drop = (1.0 - static_cast<double>(r.top_p)) * total;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    double kept = ss.p[e];
    if (r.top_p < 1.0f) {
      const uint32_t key = order_key(ss.x[e]);
      double before = 0.0;
      bool most_likely = true;
      for (int f = 0; f < n; ++f) {
        const uint32_t kf = order_key(ss.x[f]);
        if (kf < key || (kf == key && ss.id[f] > ss.id[e])) before += ss.p[f];
        else if (f != e) most_likely = false;
      }
      if (!most_likely && before + ss.p[e] <= drop) kept = 0.0;
    }
    ss.kept[e] = kept;
  }
  __syncthreads();
  double kept_total = 0.0;
  for (int e = threadIdx.x; e < n; e += kThreads) kept_total += ss.kept[e];
  kept_total = block_sum(kept_total, sh);
  // The draw: the first id whose cumulative kept mass (id order) exceeds u * kept total; each
  // thread a run of consecutive ids.
  const double target = counter_uniform(r.seed, static_cast<uint64_t>(r.output_index)) * kept_total;
  const int per = (n + kThreads - 1) / kThreads, begin = threadIdx.x * per, end = min(n, begin + per);
  double own = 0.0;
  int32_t last_kept = -1;
  for (int e = begin; e < end; ++e) {
    own += ss.kept[e];
    if (ss.kept[e] > 0.0) last_kept = ss.id[e];
  }
  double all;
  double c = block_exclusive_scan(own, all, sh);
  int32_t local = INT_MAX;
  if (c + own > target) {
    for (int e = begin; e < end; ++e) {
      if (!(ss.kept[e] > 0.0)) continue;
      c += ss.kept[e];
      if (c > target) {
        local = ss.id[e];
        break;
      }
    }
  }
  const int32_t found = block_min_max(local, false, sh);
  return found != INT_MAX ? found : block_min_max(last_kept, true, sh);  // rounding put the target past the end
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  kernel_prologue();
  __shared__ Shared sh;
  __shared__ SmallSet ss;
  const SampleRow r = a.rows[blockIdx.x];
  const int vocab = a.vocab;
  const uint16_t* raw = a.logits + int64_t(r.logits_row) * vocab;
  int32_t* out = a.out + blockIdx.x;
  const auto load_raw = [&](int i) { return bf16_bits_to_f32(raw[i]); };
  const bool greedy = sample_row_greedy(r);

  float* w = nullptr;
  if (a.work_slot[blockIdx.x] >= 0) {
    w = a.work + int64_t(a.work_slot[blockIdx.x]) * vocab;
    mask_and_penalise(a, r, w, raw);
  }
  const auto load = [&](int i) { return w ? w[i] : load_raw(i); };
  if (greedy) {
    const int32_t id = block_argmax(load, vocab, sh);
    if (threadIdx.x == 0) *out = id;
    return;
  }

  const float inv_t = __fdiv_rn(1.0f, r.temperature);
  const auto tempered = [&](int i) { return __fmul_rn(load(i), inv_t); };
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = tempered(i);
    local_max = x > local_max ? x : local_max;
  }
  const float max_t = block_max(local_max, sh);
  if (!isfinite(max_t)) {  // everything masked or broken: the reference falls back to the raw argmax
    const int32_t id = block_argmax(load_raw, vocab, sh);
    if (threadIdx.x == 0) *out = id;
    return;
  }
  const double max_d = max_t;
  const auto prob = [&](float x) { return exp(static_cast<double>(x) - max_d); };

  // Candidates: finite tempered values with key >= lo.
  uint32_t lo = order_key(-INFINITY) + 1;
  if (r.min_p > 0.0f) {
    if (threadIdx.x == 0) {
      uint32_t a_key = lo, b_key = order_key(max_t);  // prob(max) = 1 >= min_p
      while (a_key < b_key) {
        const uint32_t mid = a_key + (b_key - a_key) / 2;
        if (prob(key_value(mid)) >= static_cast<double>(r.min_p)) b_key = mid;
        else a_key = mid + 1;
      }
      sh.u32[1] = a_key;
    }
    __syncthreads();
    lo = sh.u32[1];
    __syncthreads();
  }
  const auto candidate = [&](float x, uint32_t key) { return x > -INFINITY && key >= lo; };

  int kept_count = INT_MAX;  // the candidates after min_p and top_k (INT_MAX: not counted)
  if (r.top_k > 0 || r.min_p > 0.0f) {
    int count = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = tempered(i);
      count += candidate(x, order_key(x));
    }
    count = block_sum(count, sh);
    kept_count = count;
    if (r.top_k > 0 && r.top_k < count) {
      // Non-candidates keyed 0, below every candidate (lo > 0): the k-th largest is a candidate.
      const auto candidate_keys = [&](const auto& f) {
        for (int i = threadIdx.x; i < vocab; i += kThreads) {
          const float x = tempered(i);
          const uint32_t key = order_key(x);
          f(candidate(x, key) ? key : 0u);
        }
      };
      int ties_in, ties_total;
      const uint32_t kth = radix_select_kth(candidate_keys, r.top_k, ties_in, ties_total, sh);
      if (kth > lo) {
        lo = kth;
        kept_count = r.top_k - ties_in + ties_total;  // the larger keys and every tie with the k-th
      }
    }
  }
  if (kept_count <= kSmallSet) {
    const int32_t id = draw_small_set(r, vocab, tempered, candidate, prob, ss, sh);
    if (threadIdx.x == 0) *out = id;
    return;
  }

  double total = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = tempered(i);
    if (candidate(x, order_key(x))) total += prob(x);
  }
  total = block_sum(total, sh);

  // Kept: key > cut, or key == cut and among the lowest keep_ties ids of that value.
  uint32_t cut = lo - 1;
  int keep_ties = 0;
  double kept_total = total;
  if (r.top_p < 1.0f) {
    const double drop = (1.0 - static_cast<double>(r.top_p)) * total;
    // Smallest key K with mass(key <= K) > drop; mass(key < s_lo) = base <= drop throughout.
    uint32_t s_lo = lo, s_hi = order_key(max_t);
    double base = 0.0;
    while (s_lo < s_hi) {
      uint32_t pivot[kPivots];
      for (int j = 0; j < kPivots; ++j)
        pivot[j] = s_lo + static_cast<uint32_t>((static_cast<uint64_t>(s_hi - s_lo) * (j + 1)) / (kPivots + 1));
      double mass[kPivots] = {};
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float x = tempered(i);
        const uint32_t key = order_key(x);
        if (!candidate(x, key) || key < s_lo || key > pivot[kPivots - 1]) continue;
        const double p = prob(x);
#pragma unroll
        for (int j = 0; j < kPivots; ++j) mass[j] += key <= pivot[j] ? p : 0.0;
      }
      block_sums(mass, sh);
      int j = 0;
      while (j < kPivots && !(base + mass[j] > drop)) ++j;
      if (j == kPivots) {
        s_lo = pivot[kPivots - 1] + 1;
        base += mass[kPivots - 1];
      } else {
        s_hi = pivot[j];
        if (j > 0) {
          s_lo = pivot[j - 1] + 1;
          base += mass[j - 1];
        }
      }
    }
    cut = s_lo;
    double below = 0.0, above = 0.0;
    int ties = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = tempered(i);
      const uint32_t key = order_key(x);
      if (!candidate(x, key)) continue;
      if (key < cut) below += prob(x);
      else if (key > cut) above += prob(x);
      else ++ties;
    }
    below = block_sum(below, sh);
    above = block_sum(above, sh);
    ties = block_sum(ties, sh);
    // The ascending walk drops tied tokens (highest ids first) while the mass stays <= drop; the
    // most likely token always stays.
    const double p_cut = prob(key_value(cut));
    int dropped = 0;
    if (drop - below >= 0.0) dropped = static_cast<int>(fmin(floor((drop - below) / p_cut), double(ties)));
    while (dropped > 0 && below + dropped * p_cut > drop) --dropped;
    while (dropped < ties && below + (dropped + 1) * p_cut <= drop) ++dropped;
    if (cut == order_key(max_t)) dropped = min(dropped, ties - 1);
    keep_ties = ties - dropped;
    kept_total = above + keep_ties * p_cut;
  }

  // The draw: first id (in id order) whose cumulative kept mass exceeds target.
  const double target = counter_uniform(r.seed, static_cast<uint64_t>(r.output_index)) * kept_total;
  double carry = 0.0;
  int tie_carry = 0;
  int32_t found = INT_MAX, last_kept = -1;
  for (int tile = 0; tile < vocab; tile += kThreads * kChunk) {
    const int begin = tile + threadIdx.x * kChunk;
    float xs[kChunk];
    uint32_t keys[kChunk];
    int ties = 0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int i = begin + j;
      xs[j] = i < vocab ? tempered(i) : -INFINITY;
      keys[j] = order_key(xs[j]);
      ties += candidate(xs[j], keys[j]) && keys[j] == cut;
    }
    int tile_ties;
    int tie_rank = tie_carry + block_exclusive_scan(ties, tile_ties, sh);
    double ps[kChunk];
    double own = 0.0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      bool kept = false;
      if (candidate(xs[j], keys[j])) {
        if (keys[j] > cut) kept = true;
        else if (keys[j] == cut) kept = tie_rank++ < keep_ties;
      }
      ps[j] = kept ? prob(xs[j]) : -1.0;
      if (kept) {
        own += ps[j];
        last_kept = begin + j;
      }
    }
    double tile_total;
    const double start = carry + block_exclusive_scan(own, tile_total, sh);
    int32_t local = INT_MAX;
    if (start + own > target) {
      double c = 0.0;
      for (int j = 0; j < kChunk; ++j) {
        if (ps[j] < 0.0) continue;
        c += ps[j];
        if (start + c > target) {
          local = begin + j;
          break;
        }
      }
    }
    found = block_min_max(local, false, sh);
    if (found != INT_MAX) break;
    carry += tile_total;
    tie_carry += tile_ties;
  }
  if (found == INT_MAX) found = block_min_max(last_kept, true, sh);  // rounding put the target past the end
  if (threadIdx.x == 0) *out = found;
}

// A logit's key for the top k: NaN below everything (below -inf's key, which is > 0).
__device__ __forceinline__ uint32_t logprob_key(float x) { return isnan(x) ? 0u : order_key(x); }

// The 8 logits of a 16-byte word (ids 8c .. 8c + 7, the lower half of each 32 bits first).
__device__ __forceinline__ void unpack8(const uint4& u, float (&x)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[2 * j] = __uint_as_float(w[j] << 16);
    x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// f(id, logit) for this thread's share of a bf16 row: 16-byte loads, 4 in flight, when the row is
// 16-byte aligned (one memory pass over a 200K row from one SM is latency-bound otherwise).
template <class F>
__device__ void for_each_logit(const uint16_t* raw, int vocab, const F& f) {
  constexpr int kLoads = 4;
  int tail = 0;
  if ((reinterpret_cast<uintptr_t>(raw) & 15u) == 0) {
    const uint4* words = reinterpret_cast<const uint4*>(raw);
    const int n = vocab / 8;
    int c = threadIdx.x;
    for (; c + (kLoads - 1) * kThreads < n; c += kLoads * kThreads) {
      uint4 u[kLoads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) u[l] = words[c + l * kThreads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        float x[8];
        unpack8(u[l], x);
#pragma unroll
        for (int j = 0; j < 8; ++j) f(8 * (c + l * kThreads) + j, x[j]);
      }
    }
    for (; c < n; c += kThreads) {
      float x[8];
      unpack8(words[c], x);
#pragma unroll
      for (int j = 0; j < 8; ++j) f(8 * c + j, x[j]);
    }
    tail = 8 * n;
  }
  for (int i = tail + threadIdx.x; i < vocab; i += kThreads) f(i, bf16_bits_to_f32(raw[i]));
}

// Passes over the raw row: (1) max with an online sum of expf(x - max) (rescaled when the max
// grows) and the asked tokens' ranks; (2-4) the radix select of the k-th largest key; (5) the
// gather, in id-ordered tiles until the k are found.
__global__ void __launch_bounds__(kThreads) logprobs_kernel(LogprobArgs a) {
  kernel_prologue();
  __shared__ Shared sh;
  __shared__ int32_t top_id[kMaxTopLogprobs];
  __shared__ uint32_t top_key[kMaxTopLogprobs];
  __shared__ int top_count;
  const LogprobRow q = a.rows[blockIdx.x];
  const int vocab = a.vocab;
  const uint16_t* raw = a.logits + int64_t(q.logits_row) * vocab;
  int32_t token[2];
  float token_x[2];
  for (int t = 0; t < 2; ++t) {
    token[t] = q.drawn_by[t] >= 0 ? a.drawn[q.drawn_by[t]] : q.token[t];
    token_x[t] = token[t] >= 0 && token[t] < vocab ? bf16_bits_to_f32(raw[token[t]]) : NAN;
  }

  float m = -INFINITY;
  double s = 0.0;
  int above[2] = {0, 0};
  for_each_logit(raw, vocab, [&](int, float x) {
    if (x > m) {  // a NaN never raises the max (as the reference's std::max)
      s = s * static_cast<double>(expf(m - x)) + 1.0;  // exp(-inf) = 0 for the first finite value
      m = x;
    } else if (x != -INFINITY) {  // -inf adds 0 (and exp(-inf - -inf) would be NaN)
      s += static_cast<double>(expf(x - m));
    }
    above[0] += x > token_x[0];
    above[1] += x > token_x[1];
  });
  const float max_x = block_max(m, sh);
  // A thread that saw only -inf (or nothing) adds nothing, unless the whole row is -inf: then NaN,
  // as the reference's exp(-inf - -inf).
  const double part = m == -INFINITY && max_x != -INFINITY ? 0.0 : s * static_cast<double>(expf(m - max_x));
  const double sum = block_sum(part, sh);
  above[0] = block_sum(above[0], sh);
  above[1] = block_sum(above[1], sh);
  const double log_norm = static_cast<double>(max_x) + log(sum);
  const auto logprob = [&](float x) { return static_cast<float>(static_cast<double>(x) - log_norm); };

  const int k = min(q.top_k, vocab);
  if (k > 0) {
    const auto keys = [&](const auto& f) { for_each_logit(raw, vocab, [&](int, float x) { f(logprob_key(x)); }); };
    int ties_in;
    int ties_total;
    const uint32_t kth = radix_select_kth(keys, k, ties_in, ties_total, sh);
    // The larger keys in any order (slots by atomics; the sort below fixes the order), and the
    // first ties_in ids holding kth: all of them when every tie is in (the usual case: one pass,
    // no order needed), else in id order by tiles of kThreads * kChunk consecutive ids, a thread's
    // kChunk (8) ids one 16-byte word when the row is aligned.
    if (threadIdx.x == 0) top_count = 0;
    __syncthreads();
    const auto take = [&](int id, uint32_t key) {
      const int slot = atomicAdd(&top_count, 1);
      if (slot < kMaxTopLogprobs) {
        top_id[slot] = id;
        top_key[slot] = key;
      }
    };
    if (ties_total == ties_in) {
      for_each_logit(raw, vocab, [&](int id, float x) {
        const uint32_t key = logprob_key(x);
        if (key >= kth) take(id, key);
      });
    }
    const bool aligned = (reinterpret_cast<uintptr_t>(raw) & 15u) == 0;
    int tie_carry = 0;
    for (int tile = 0; ties_total != ties_in && tile < vocab; tile += kThreads * kChunk) {
      const int begin = tile + threadIdx.x * kChunk;
      float x[kChunk];
      if (aligned && begin + kChunk <= vocab) {
        unpack8(reinterpret_cast<const uint4*>(raw)[begin / kChunk], x);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) x[j] = begin + j < vocab ? bf16_bits_to_f32(raw[begin + j]) : NAN;
      }
      uint32_t key[kChunk];
      int ties = 0;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        key[j] = begin + j < vocab ? logprob_key(x[j]) : 0u;
        ties += begin + j < vocab && key[j] == kth;
      }
      int tile_ties;
      int tie_rank = tie_carry + block_exclusive_scan(ties, tile_ties, sh);
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (begin + j >= vocab) continue;
        if (key[j] > kth || (key[j] == kth && tie_rank++ < ties_in)) take(begin + j, key[j]);
      }
      tie_carry += tile_ties;
      __syncthreads();
      if (top_count >= k) break;  // every thread read it before the next tile's atomics (after its scan)
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int n = min(top_count, k);
      for (int i = 1; i < n; ++i) {  // insertion sort: key descending, id ascending
        const int32_t id = top_id[i];
        const uint32_t key = top_key[i];
        int at = i;
        while (at > 0 && (top_key[at - 1] < key || (top_key[at - 1] == key && top_id[at - 1] > id))) {
          top_id[at] = top_id[at - 1];
          top_key[at] = top_key[at - 1];
          --at;
        }
        top_id[at] = id;
        top_key[at] = key;
      }
      RowLogprobs& out = a.out[blockIdx.x];
      out.num_top = n;
      for (int i = 0; i < n; ++i) {
        out.top_id[i] = top_id[i];
        out.top_logprob[i] = logprob(bf16_bits_to_f32(raw[top_id[i]]));
      }
    }
  } else if (threadIdx.x == 0) {
    a.out[blockIdx.x].num_top = 0;
  }
  if (threadIdx.x == 0) {
    RowLogprobs& out = a.out[blockIdx.x];
    for (int t = 0; t < 2; ++t) {
      const bool asked = token[t] >= 0 && token[t] < vocab;
      out.token[t] = asked ? token[t] : -1;
      out.logprob[t] = asked ? logprob(token_x[t]) : 0.0f;
      out.rank[t] = asked ? 1 + above[t] : 0;
    }
  }
}

}  // namespace

cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0) return cudaSuccess;
  launch_kernel(sample_kernel, args.num_rows, kThreads, 0, stream, args);
  return cudaGetLastError();
}

cudaError_t launch_logprobs(const LogprobArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0) return cudaSuccess;
  launch_kernel(logprobs_kernel, args.num_rows, kThreads, 0, stream, args);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
