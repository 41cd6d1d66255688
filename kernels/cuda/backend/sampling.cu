// Sampling on the GPU: ops/sampling.h's semantics, no sort. A row is a cluster of kRowCtas CTAs,
// each over its own span of consecutive ids, reducing across the cluster in a fixed order
// (sampling_row.cuh): a 200K-token row's passes run on kRowCtas multiprocessors instead of one.
//
// Per row (vocab ~200K, read from the bf16 logits as the head wrote them):
//   mask + penalties   into an fp32 copy of the row (only rows that have them; the structured-output
//                      bitmask of a constrained row sets every token it leaves out to -inf)
//   greedy             argmax, lowest id on ties
//   max                of the tempered row; non-finite -> argmax of the raw row (as the reference)
//   min_p              a value threshold: the smallest float v with exp(v - max) >= min_p, found by
//                      one thread's binary search over the float order (exp is monotone)
//   top_k              the k-th largest value by radix select on order-preserving keys (11/11/10
//                      bit digits, shared-memory histograms summed over the cluster); ties with it
//                      are kept
//   top_p              vLLM's rule without sorting: the cut value v_c is the smallest value whose
//                      ascending cumulative mass exceeds (1 - top_p) * total, found by a search
//                      over the keys (7 pivots per pass, masses in double); below v_c everything
//                      is dropped, above kept, and of the tokens tied at v_c the highest ids go
//                      first (the reference's ascending order breaks ties by descending id)
//   draw               inverse CDF in token-id order: blocked prefix sums in double, the first id
//                      whose cumulative mass exceeds u * kept mass, u = counter_uniform(seed, index);
//                      each CTA walks its span from the kept mass of the spans before it
//   small set          when min_p and top_k leave <= 1024 candidates: top_p and the draw over them in
//                      shared memory (draw_small_set) instead of the top_p search and draw passes
// Logprobs (logprobs_kernel, after the draw, a cluster per LogprobRow of the raw bf16 row):
//   max and sum of expf(x - max) in one pass (a thread's sum rescaled when its max grows, then
//   the threads' sums to their CTA's max, the CTAs' to the row's), in double, with the asked
//   tokens' ranks (counts of larger logits); log_norm = max + log(sum), so a logprob differs from
//   the reference's (exp in double) by the float exps' rounding, ~1e-6 at most; 16-byte loads, 4
//   in flight
//   top k              a second pass counts the keys (a bf16 logit's order key is 16 bits) within
//                      6 distances of the max's and keeps those within a binade; the tightest
//                      distance with k or more bounds the candidates (at most 512 in the row:
//                      those kept, or a third pass's gather), which the first CTA ranks (key
//                      descending, id ascending). A row with more than 512 keys at its top (ties,
//                      a flat top) takes the radix select of the k-th largest key (digits of 11
//                      and 5 bits) and gathers its larger keys and, in id order across the
//                      spans, its share of the ties. No contended atomics on the common path.
// Every reduction has a fixed order (warp butterflies, warps in index order, CTAs in rank order;
// no float atomics), so a row gives the same id on every run and in every batch. Against the host
// reference the sums differ in association only: a different id needs the draw (or the top_p cut,
// or a min_p test) within ~1e-12 of a boundary; backend_check's `sampling` group checks exactly
// that.
#include <cmath>
#include <climits>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/sampling_row.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kChunk = 8;  // consecutive elements per thread in the id-ordered walks

// Order-preserving key of a float (-0 counts as +0: equal values, equal keys).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(__fadd_rn(f, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The 8 logits of a 16-byte word (ids 8c .. 8c + 7, the lower half of each 32 bits first).
__device__ __forceinline__ void unpack8(const uint4& u, float (&x)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[2 * j] = __uint_as_float(w[j] << 16);
    x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// f(id, logit) for this thread's share of the CTA's span of a bf16 row: 16-byte loads, 4 in
// flight, when the row is 16-byte aligned (spans start at multiples of 8 ids).
template <class F>
__device__ void for_each_logit(const uint16_t* raw, const RowPart& p, const F& f) {
  constexpr int kLoads = 4;
  int tail = p.begin;
  if ((reinterpret_cast<uintptr_t>(raw) & 15u) == 0) {
    const uint4* words = reinterpret_cast<const uint4*>(raw + p.begin);
    const int n = (p.end - p.begin) / 8;
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
        for (int j = 0; j < 8; ++j) f(p.begin + 8 * (c + l * kThreads) + j, x[j]);
      }
    }
    for (; c < n; c += kThreads) {
      float x[8];
      unpack8(words[c], x);
#pragma unroll
      for (int j = 0; j < 8; ++j) f(p.begin + 8 * c + j, x[j]);
    }
    tail = p.begin + 8 * n;
  }
  for (int i = tail + threadIdx.x; i < p.end; i += kThreads) f(i, bf16_bits_to_f32(raw[i]));
}

// f(id, value) for this thread's share of the CTA's span of the row: the fp32 work copy w when
// there is one (16-byte loads of 4 values), else the raw bf16 row (for_each_logit).
template <class F>
__device__ void for_each_value(const uint16_t* raw, const float* w, const RowPart& p, const F& f) {
  if (w == nullptr) {
    for_each_logit(raw, p, f);
    return;
  }
  constexpr int kLoads = 4;
  int tail = p.begin;
  if ((reinterpret_cast<uintptr_t>(w + p.begin) & 15u) == 0) {
    const float4* words = reinterpret_cast<const float4*>(w + p.begin);
    const int n = (p.end - p.begin) / 4;
    int c = threadIdx.x;
    for (; c + (kLoads - 1) * kThreads < n; c += kLoads * kThreads) {
      float4 u[kLoads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) u[l] = words[c + l * kThreads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const int id = p.begin + 4 * (c + l * kThreads);
        f(id, u[l].x);
        f(id + 1, u[l].y);
        f(id + 2, u[l].z);
        f(id + 3, u[l].w);
      }
    }
    for (; c < n; c += kThreads) {
      const float4 u = words[c];
      const int id = p.begin + 4 * c;
      f(id, u.x);
      f(id + 1, u.y);
      f(id + 2, u.z);
      f(id + 3, u.w);
    }
    tail = p.begin + 4 * n;
  }
  for (int i = tail + threadIdx.x; i < p.end; i += kThreads) f(i, w[i]);
}

// The kChunk (8) values of ids begin .. begin + 7 below end (past it: NaN), one or two 16-byte
// loads when aligned.
__device__ __forceinline__ void load_chunk(const uint16_t* raw, const float* w, int begin, int end, float (&x)[8]) {
  if (w == nullptr) {
    if ((reinterpret_cast<uintptr_t>(raw) & 15u) == 0 && begin + 8 <= end) {
      unpack8(reinterpret_cast<const uint4*>(raw)[begin / 8], x);
      return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = begin + j < end ? bf16_bits_to_f32(raw[begin + j]) : NAN;
    return;
  }
  if ((reinterpret_cast<uintptr_t>(w) & 15u) == 0 && begin + 8 <= end) {
    const float4 u = reinterpret_cast<const float4*>(w + begin)[0], v = reinterpret_cast<const float4*>(w + begin)[1];
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = begin + j < end ? w[begin + j] : NAN;
}

__device__ __forceinline__ void penalise(float* w, int32_t id, const RowPart& p, float r) {
  if (id < p.begin || id >= p.end) return;
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

// The reference's mask and penalties, in its order, on the fp32 copy w of this CTA's span (each
// CTA applies the lists' ids that fall in its span: no CTA writes or reads another's part of w).
__device__ void mask_and_penalise(const SampleArgs& a, const SampleRow& r, const RowPart& p, float* w,
                                  const uint16_t* raw) {
  const uint32_t* allowed = r.allowed_row >= 0 ? a.allowed + int64_t(r.allowed_row) * a.allowed_words : nullptr;
  const auto mine = [&](int32_t id) { return id >= p.begin && id < p.end; };
  for (int i = p.begin + threadIdx.x; i < p.end; i += kThreads) {
    const bool ok = !allowed || ((allowed[i >> 5] >> (i & 31)) & 1u);
    w[i] = ok ? bf16_bits_to_f32(raw[i]) : -INFINITY;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < r.num_masked; i += kThreads) {
    const int32_t id = a.ids[r.masked_begin + i];
    if (mine(id)) w[id] = -INFINITY;
  }
  __syncthreads();
  // The bias ids are distinct (SampleBatch::add), so no two threads add to one logit.
  for (int i = threadIdx.x; i < r.num_bias; i += kThreads) {
    const int32_t id = a.ids[r.bias_begin + i];
    if (mine(id)) w[id] = __fadd_rn(w[id], a.biases[r.bias_begin + i]);
  }
  __syncthreads();
  const int32_t* prompt = a.ids + r.prompt_begin;
  if (r.repetition_penalty != 1.0f) {
    for (int i = threadIdx.x; i < r.num_prompt; i += kThreads) penalise(w, prompt[i], p, r.repetition_penalty);
    __syncthreads();
    for (int i = threadIdx.x; i < r.num_output; i += kThreads) {
      const int32_t id = a.ids[r.output_begin + i];
      if (!sorted_contains(prompt, r.num_prompt, id)) penalise(w, id, p, r.repetition_penalty);
    }
    __syncthreads();
  }
  if (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f) {
    for (int i = threadIdx.x; i < r.num_output; i += kThreads) {
      const int32_t id = a.ids[r.output_begin + i], count = a.counts[r.output_begin + i];
      if (!mine(id) || count <= 0) continue;
      w[id] = __fsub_rn(w[id], __fadd_rn(__fmul_rn(r.frequency_penalty, static_cast<float>(count)), r.presence_penalty));
    }
  }
  __syncthreads();
}

// At most kSmallSet candidates left after min_p and top_k (the usual top_k of 20-100): each CTA
// gathers its span's into shared memory and puts them in id order, every CTA copies the row's in
// rank order (id order: the spans ascend), and top_p and the draw run there, alike in every CTA,
// with the rules of the full-row path below instead of its passes over the row (a top_p search of
// up to 11 passes and a draw that walks the row). The masses are the same exps; only their sums'
// association differs.
constexpr int kSmallSet = 1024;
struct SmallSet {
  int32_t any_id[kSmallSet];  // this span's, gathered in any order, then in id order (read by the other CTAs)
  float any_x[kSmallSet];
  int32_t id[kSmallSet];      // in id order: this span's, then the row's
  float x[kSmallSet];
  double p[kSmallSet];        // exp(x - max)
  double kept[kSmallSet];     // p, or 0 when top_p drops it
  int count;
};

template <class EachTempered, class Candidate, class Prob>
__device__ int32_t draw_small_set(const SampleRow& r, const EachTempered& each_tempered, const Candidate& candidate,
                                  const Prob& prob, SmallSet& ss, Shared& sh) {
  if (threadIdx.x == 0) ss.count = 0;
  __syncthreads();
  each_tempered([&](int i, float x) {
    if (!candidate(x, order_key(x))) return;
    const int slot = atomicAdd(&ss.count, 1);
    if (slot < kSmallSet) {
      ss.any_id[slot] = i;
      ss.any_x[slot] = x;
    }
  });
  __syncthreads();
  const int mine = min(ss.count, kSmallSet);
  for (int e = threadIdx.x; e < mine; e += kThreads) {  // ids are distinct: rank = how many are lower
    const int32_t id = ss.any_id[e];
    int rank = 0;
    for (int f = 0; f < mine; ++f) rank += ss.any_id[f] < id;
    ss.id[rank] = id;
    ss.x[rank] = ss.any_x[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < mine; e += kThreads) {
    ss.any_id[e] = ss.id[e];
    ss.any_x[e] = ss.x[e];
  }
  __syncthreads();
  int n = 0;
  exchange(mine, sh, [&](const int* counts) {
    auto cluster = cooperative_groups::this_cluster();
    int offset = 0;
    for (int c = 0; c < kRowCtas; ++c) {
      const int take = min(counts[c], kSmallSet - offset);
      const int32_t* ids = cluster.map_shared_rank(&ss.any_id[0], c);
      const float* xs = cluster.map_shared_rank(&ss.any_x[0], c);
      for (int e = threadIdx.x; e < take; e += kThreads) {
        ss.id[offset + e] = ids[e];
        ss.x[offset + e] = xs[e];
      }
      offset += take;
    }
    n = offset;
  });
  for (int e = threadIdx.x; e < n; e += kThreads) ss.p[e] = prob(ss.x[e]);
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

// What the top_p cut leaves of each CTA's span, for the draw's walk.
struct CutCounts {
  double below;
  double above;
  int ties;
};
// What each CTA's walk found: the first id past the target, the last kept id.
struct DrawFound {
  int32_t found;
  int32_t last_kept;
};

// The id drawn for row r (the same in every CTA of the row).
__device__ int32_t sample_row(const SampleArgs& a, const SampleRow& r, const RowPart& part, Shared& sh, SmallSet& ss) {
  const uint16_t* raw = a.logits + int64_t(r.logits_row) * a.vocab;
  float* w = nullptr;
  if (a.work_slot[part.row] >= 0) {
    w = a.work + int64_t(a.work_slot[part.row]) * a.vocab;
    mask_and_penalise(a, r, part, w, raw);
  }
  if (sample_row_greedy(r)) return row_argmax([&](const auto& f) { for_each_value(raw, w, part, f); }, sh);

  const float inv_t = __fdiv_rn(1.0f, r.temperature);
  // f(id, tempered value) for this thread's share of the span, in any order.
  const auto each_tempered = [&](const auto& f) {
    for_each_value(raw, w, part, [&](int i, float x) { f(i, __fmul_rn(x, inv_t)); });
  };
  float local_max = -INFINITY;
  each_tempered([&](int, float x) { local_max = x > local_max ? x : local_max; });
  const float max_t = row_max(local_max, sh);
  // Everything masked or broken: the reference falls back to the raw argmax.
  if (!isfinite(max_t)) return row_argmax([&](const auto& f) { for_each_logit(raw, part, f); }, sh);
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
    each_tempered([&](int, float x) { count += candidate(x, order_key(x)); });
    count = row_sum(count, sh);
    kept_count = count;
    if (r.top_k > 0 && r.top_k < count) {
      // Non-candidates keyed 0, below every candidate (lo > 0): the k-th largest is a candidate.
      const auto candidate_keys = [&](const auto& f) {
        each_tempered([&](int, float x) {
          const uint32_t key = order_key(x);
          f(candidate(x, key) ? key : 0u);
        });
      };
      int ties_in, ties_total;
      const uint32_t kth = row_select_kth<32>(candidate_keys, r.top_k, ties_in, ties_total, sh);
      if (kth > lo) {
        lo = kth;
        kept_count = r.top_k - ties_in + ties_total;  // the larger keys and every tie with the k-th
      }
    }
  }
  if (kept_count <= kSmallSet) return draw_small_set(r, each_tempered, candidate, prob, ss, sh);

  // The candidates' mass, each CTA's and the row's.
  double span_total = 0.0;
  each_tempered([&](int, float x) {
    if (candidate(x, order_key(x))) span_total += prob(x);
  });
  const double* totals = exchange(block_sum(span_total, sh), sh);
  double total = 0.0, kept_before = 0.0;
  for (int c = 0; c < kRowCtas; ++c) {
    total += totals[c];
    if (c < part.rank) kept_before += totals[c];
  }

  // Kept: key > cut, or key == cut and among the lowest keep_ties ids of that value.
  uint32_t cut = lo - 1;
  int keep_ties = 0, ties_before = 0;
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
      each_tempered([&](int, float x) {
        const uint32_t key = order_key(x);
        if (!candidate(x, key) || key < s_lo || key > pivot[kPivots - 1]) return;
        const double p = prob(x);
#pragma unroll
        for (int j = 0; j < kPivots; ++j) mass[j] += key <= pivot[j] ? p : 0.0;
      });
      row_sums(mass, sh);
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
    each_tempered([&](int, float x) {
      const uint32_t key = order_key(x);
      if (!candidate(x, key)) return;
      if (key < cut) below += prob(x);
      else if (key > cut) above += prob(x);
      else ++ties;
    });
    CutCounts mine;
    mine.below = block_sum(below, sh);
    mine.above = block_sum(above, sh);
    mine.ties = block_sum(ties, sh);
    const CutCounts* spans = exchange(mine, sh);
    below = above = 0.0;
    ties = 0;
    for (int c = 0; c < kRowCtas; ++c) {
      below += spans[c].below;
      above += spans[c].above;
      ties += spans[c].ties;
    }
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
    // The kept ties are the lowest ids of the value: the spans before this one keep theirs first.
    kept_before = 0.0;
    int ties_seen = 0;
    for (int c = 0; c < kRowCtas; ++c) {
      const int kept_ties = max(0, min(spans[c].ties, keep_ties - ties_seen));
      const double kept = spans[c].above + kept_ties * p_cut;
      if (c < part.rank) kept_before += kept;
      if (c == part.rank) ties_before = ties_seen;
      ties_seen += spans[c].ties;
    }
  }

  // The draw: the first id (in id order) whose cumulative kept mass exceeds target. Each CTA walks
  // its span from the mass of the spans before it; the first CTA to find one has the row's.
  const double target = counter_uniform(r.seed, static_cast<uint64_t>(r.output_index)) * kept_total;
  DrawFound mine{INT_MAX, -1};
  double carry = kept_before;
  int tie_carry = ties_before;
  for (int tile = part.begin; tile < part.end; tile += kThreads * kChunk) {
    const int begin = tile + threadIdx.x * kChunk;
    float xs[kChunk];
    uint32_t keys[kChunk];
    int ties = 0;
    load_chunk(raw, w, begin, part.end, xs);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      xs[j] = begin + j < part.end ? __fmul_rn(xs[j], inv_t) : -INFINITY;
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
        mine.last_kept = begin + j;
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
    mine.found = block_min_max(local, false, sh);
    if (mine.found != INT_MAX) break;
    carry += tile_total;
    tie_carry += tile_ties;
  }
  mine.last_kept = block_min_max(mine.last_kept, true, sh);
  const DrawFound* spans = exchange(mine, sh);
  int32_t found = INT_MAX, last_kept = -1;
  for (int c = 0; c < kRowCtas; ++c) {
    found = min(found, spans[c].found);
    last_kept = max(last_kept, spans[c].last_kept);
  }
  return found != INT_MAX ? found : last_kept;  // rounding put the target past the end
}

__global__ void __launch_bounds__(kThreads, 2) sample_kernel(SampleArgs a) {
  kernel_prologue();
  __shared__ Shared sh;
  __shared__ SmallSet ss;
  row_begin();
  const RowPart part = row_part(a.vocab);
  const int32_t id = sample_row(a, a.rows[part.row], part, sh, ss);
  if (part.rank == 0 && threadIdx.x == 0) a.out[part.row] = id;
  row_end();
}

// A logit's key for the top k: NaN below everything (below -inf's key, which is > 0). The logits
// are bf16, so the high 16 bits of a float's order key are all of it (equal high bits mean equal
// values), and the radix select needs two digits (11 and 5 bits), not three.
constexpr int kLogprobKeyBits = 16;
__device__ __forceinline__ uint32_t logprob_key(float x) { return isnan(x) ? 0u : order_key(x) >> 16; }

// Each CTA's share of the softmax's normaliser: its max, the sum of exp(x - that max), the counts
// of logits above the asked tokens'.
struct NormPart {
  float max;
  int above[2];
  double sum;
};

// The top k's candidates: distances below the row's largest key (bf16 ulps; 128 is a binade) at
// which the second pass counts the keys within, the tightest with k or more bounding the
// candidates. The pass also keeps each key within kGatherPivot's distance (up to kCandidates a
// CTA), so that where that pivot or a tighter one bounds at most kCandidates keys, no further
// pass is needed: a peaked row's top 20 are within a binade of its max, and a few hundred keys
// at most. One slot of row_sums' kPivots is the overflow flag.
constexpr int kTopPivots = kPivots - 1;
constexpr int kGatherPivot = 4;
constexpr int kCandidates = kThreads;  // a CTA's kept keys, and a row's candidates: one a thread
__device__ __forceinline__ uint32_t pivot_distance(int j) {
  constexpr uint32_t kDistance[kTopPivots] = {4, 16, 32, 64, 128, 512};
  return kDistance[j];
}

// The passes over each CTA's span of the raw row: (1) max with an online sum of expf(x - max)
// (rescaled when the max grows) and the asked tokens' ranks; then, when a top k is asked, (2) the
// counts at the pivots below the max and the keys within a binade of it. Most rows need no more:
// the pivot that bounds the top k keeps at most kCandidates, which rank 0 ranks (key descending,
// id ascending). Otherwise (3) a gather at the chosen pivot, or, where more than kCandidates keys
// tie or crowd at the top (a flat row, a row of a few values), the radix select of the k-th
// largest key and a gather of the larger keys and, in id order across the spans, its ties.
__global__ void __launch_bounds__(kThreads, 2) logprobs_kernel(LogprobArgs a) {
  kernel_prologue();
  __shared__ Shared sh;
  __shared__ int32_t cand_id[kCandidates];  // this span's candidates (read by rank 0)
  __shared__ uint32_t cand_key[kCandidates];
  __shared__ int cand_count;
  __shared__ int32_t merged_id[kCandidates];  // rank 0: every span's candidates
  __shared__ uint32_t merged_key[kCandidates];
  row_begin();
  const int vocab = a.vocab;
  const RowPart part = row_part(vocab);
  const LogprobRow q = a.rows[part.row];
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
  for_each_logit(raw, part, [&](int, float x) {
    if (x > m) {  // a NaN never raises the max (as the reference's std::max)
      s = s * static_cast<double>(expf(m - x)) + 1.0;  // exp(-inf) = 0 for the first finite value
      m = x;
    } else if (x != -INFINITY) {  // -inf adds 0 (and exp(-inf - -inf) would be NaN)
      s += static_cast<double>(expf(x - m));
    }
    above[0] += x > token_x[0];
    above[1] += x > token_x[1];
  });
  // A share (a thread's, then a CTA's) that saw only -inf (or nothing) adds nothing; a NaN logit
  // makes the sum NaN, as the reference's, also where its share held nothing else (m stays -inf);
  // a row of nothing but -inf gives NaN too, as the reference's exp(-inf - -inf).
  const auto rescaled = [](double sum, float from, float to) {
    return isnan(sum) ? sum : from == -INFINITY ? 0.0 : sum * static_cast<double>(expf(from - to));
  };
  NormPart mine;
  mine.max = block_max(m, sh);
  mine.sum = block_sum(rescaled(s, m, mine.max), sh);
  mine.above[0] = block_sum(above[0], sh);
  mine.above[1] = block_sum(above[1], sh);
  const NormPart* parts = exchange(mine, sh);
  float max_x = parts[0].max;
  for (int c = 1; c < kRowCtas; ++c) max_x = parts[c].max > max_x ? parts[c].max : max_x;
  double sum = 0.0;
  above[0] = above[1] = 0;
  for (int c = 0; c < kRowCtas; ++c) {
    sum += rescaled(parts[c].sum, parts[c].max, max_x);
    above[0] += parts[c].above[0];
    above[1] += parts[c].above[1];
  }
  if (max_x == -INFINITY) sum = NAN;
  const double log_norm = static_cast<double>(max_x) + log(sum);
  const auto logprob = [&](float x) { return static_cast<float>(static_cast<double>(x) - log_norm); };

  const int k = min(q.top_k, vocab);
  int n_picked = 0;  // rank 0: every span's candidates, k or more
  if (k > 0) {
    // false when the span's slots are full (no more atomics on the count once they are: a row
    // of a few values may have tens of thousands of keys at its top).
    const auto keep = [&](int id, uint32_t key) {
      if (*reinterpret_cast<volatile int*>(&cand_count) >= kCandidates) return false;
      const int slot = atomicAdd(&cand_count, 1);
      if (slot >= kCandidates) return false;
      cand_id[slot] = id;
      cand_key[slot] = key;
      return true;
    };
    const auto restart = [&] {
      __syncthreads();  // every thread has read the candidates it keeps
      if (threadIdx.x == 0) cand_count = 0;
      __syncthreads();
    };
    // A key's distance below the row's largest: max_x is never NaN and every other logit's key is
    // at most its key; NaN (key 0) is infinitely far, so NaN logits are never candidates here
    // (they are last in the top k, only where fewer than k others exist: the radix path's case).
    const uint32_t max_key = logprob_key(max_x);
    const auto distance = [&](uint32_t key) { return key == 0u ? UINT_MAX : max_key - key; };
    restart();
    double count[kPivots];
    {
      int at[kTopPivots] = {};
      bool lost = false;  // a key within the gather pivot found no slot
      for_each_logit(raw, part, [&](int id, float x) {
        const uint32_t key = logprob_key(x);
        const uint32_t d = distance(key);
#pragma unroll
        for (int j = 0; j < kTopPivots; ++j) at[j] += d <= pivot_distance(j);
        if (d <= pivot_distance(kGatherPivot) && !lost) lost = !keep(id, key);
      });
#pragma unroll
      for (int j = 0; j < kTopPivots; ++j) count[j] = at[j];
      count[kTopPivots] = lost ? 1.0 : 0.0;
    }
    row_sums(count, sh);  // the row's counts at the pivots; how many of its threads lost a key
    int chosen = kTopPivots;
    for (int j = kTopPivots - 1; j >= 0; --j)
      if (count[j] >= k) chosen = j;
    const bool bounded = chosen < kTopPivots && count[chosen] <= kCandidates;
    if (bounded && chosen <= kGatherPivot && count[kTopPivots] == 0.0) {
      // Every span kept all of its keys within the gather pivot: drop those below the chosen one.
      const int n = cand_count;  // <= kCandidates: nothing was lost
      const bool has = int(threadIdx.x) < n && distance(cand_key[threadIdx.x]) <= pivot_distance(chosen);
      const int32_t id = has ? cand_id[threadIdx.x] : 0;
      const uint32_t key = has ? cand_key[threadIdx.x] : 0u;
      restart();
      if (has) keep(id, key);
    } else if (bounded) {
      restart();
      const uint32_t cut = pivot_distance(chosen);
      for_each_logit(raw, part, [&](int id, float x) {
        const uint32_t key = logprob_key(x);
        if (distance(key) <= cut) keep(id, key);
      });
    } else {
      const auto keys = [&](const auto& f) { for_each_logit(raw, part, [&](int, float x) { f(logprob_key(x)); }); };
      int ties_in;
      int ties_total;
      const uint32_t kth = row_select_kth<kLogprobKeyBits>(keys, k, ties_in, ties_total, sh);
      // Each span's keys above kth (fewer than k in the whole row, any order: slots by atomics)
      // and its first ties_in ties with kth in id order (tiles of kThreads * kChunk consecutive
      // ids, a thread's kChunk (8) one 16-byte word when the row is aligned): k in the row.
      restart();
      int tie_carry = 0;
      for (int tile = part.begin; tile < part.end; tile += kThreads * kChunk) {
        const int begin = tile + threadIdx.x * kChunk;
        float x[kChunk];
        load_chunk(raw, nullptr, begin, part.end, x);
        uint32_t key[kChunk];
        int ties = 0;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          key[j] = begin + j < part.end ? logprob_key(x[j]) : 0u;
          ties += begin + j < part.end && key[j] == kth;
        }
        int tile_ties;
        int tie_rank = tie_carry + block_exclusive_scan(ties, tile_ties, sh);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          if (begin + j >= part.end || key[j] < kth || (key[j] == kth && tie_rank++ >= ties_in)) continue;
          keep(begin + j, key[j]);
        }
        tie_carry += tile_ties;
      }
    }
    __syncthreads();
    // Rank 0 gathers every span's candidates (at most kCandidates in the row) and writes each one
    // whose rank is below k.
    exchange(min(cand_count, kCandidates), sh, [&](const int* counts) {
      if (part.rank != 0) return;
      auto cluster = cooperative_groups::this_cluster();
      int offset = 0;
      for (int c = 0; c < kRowCtas; ++c) {
        const int32_t* ids = cluster.map_shared_rank(&cand_id[0], c);
        const uint32_t* ks = cluster.map_shared_rank(&cand_key[0], c);
        const int n = min(counts[c], kCandidates - offset);
        for (int e = threadIdx.x; e < n; e += kThreads) {
          merged_id[offset + e] = ids[e];
          merged_key[offset + e] = ks[e];
        }
        offset += n;
      }
      n_picked = offset;
    });
    if (part.rank == 0) {
      for (int e = threadIdx.x; e < n_picked; e += kThreads) {
        const int32_t id = merged_id[e];
        const uint32_t key = merged_key[e];
        int rank = 0;
        for (int f = 0; f < n_picked; ++f)
          rank += merged_key[f] > key || (merged_key[f] == key && merged_id[f] < id);
        if (rank < k) {
          a.out[part.row].top_id[rank] = id;
          a.out[part.row].top_logprob[rank] = logprob(bf16_bits_to_f32(raw[id]));
        }
      }
    }
  }
  if (part.rank == 0 && threadIdx.x == 0) {
    RowLogprobs& out = a.out[part.row];
    out.num_top = min(n_picked, k);
    for (int t = 0; t < 2; ++t) {
      const bool asked = token[t] >= 0 && token[t] < vocab;
      out.token[t] = asked ? token[t] : -1;
      out.logprob[t] = asked ? logprob(token_x[t]) : 0.0f;
      out.rank[t] = asked ? 1 + above[t] : 0;
    }
  }
  row_end();
}

// kRowCtas CTAs a row, one cluster each.
template <class Args>
cudaError_t launch_rows(void (*kernel)(Args), const Args& args, cudaStream_t stream) {
  return launch_cluster_kernel(kernel, dim3(args.num_rows * kRowCtas), dim3(kThreads), dim3(kRowCtas), 0, stream, args);
}

}  // namespace

cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0) return cudaSuccess;
  return launch_rows(sample_kernel, args, stream);
}

cudaError_t launch_logprobs(const LogprobArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0) return cudaSuccess;
  return launch_rows(logprobs_kernel, args, stream);
}

}  // namespace m3::cuda::detail
