// MoE routing on the GPU: router logits (fp32 weight, exact fp32 products), sigmoid + bias top-k
// (ties to the lower expert id) and normalisation as the CPU reference, the permutation of the
// (token, choice) pairs into rows grouped by expert with the grouped GEMM's work items, and the
// weighted combine in ascending expert id with the reference's bf16 roundings; and the copy of
// the routed rows into permuted order for the grouped GEMM's TMA.
//
// Expert parallel: routing covers all experts on every rank; only the choices of the experts this
// rank holds are counted, permuted and given work items (in held-expert indices, which equal the
// expert ids when the rank holds them all, so that case runs exactly as without the subset).
//
// Rows of one expert are placed by atomic counters, so their order inside the expert varies from
// run to run; results do not, since every row of a grouped GEMM is computed independently and the
// combine sums each token's choices in expert order.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kSmallTokens = 8;    // tokens per CTA of the decode-shaped router kernel
constexpr int kMaxGridY = 65535;      // the grid's y limit
constexpr int kMaxExperts = 512;      // launch_moe_route refuses more
// Up to here one launch routes (route_fused_kernel): its last CTA's 8 warps take the tokens' top-k
// two at a time at most, about what one more launch would cost.
constexpr int kFusedMaxTokens = 16;

// The per-expert counters topk_kernel increments start at zero (zeroed here: one launch fewer
// than a memset node; topk_kernel runs after the router in stream order).
__device__ __forceinline__ void zero_expert_counts(const MoeRouteArgs& a) {
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < a.held_experts; i += blockDim.x) a.expert_count[i] = 0;
}

// One expert's logits for the tokens [t0, t0 + kSmallTokens).
__device__ void router_small_group(const MoeRouteArgs& a, int t0) {
  const int e = blockIdx.x;
  const int nt = min(kSmallTokens, a.num_tokens - t0);
  const float* w = a.router + int64_t(e) * a.hidden;
  float acc[kSmallTokens];
#pragma unroll
  for (int i = 0; i < kSmallTokens; ++i) acc[i] = 0.0f;
  // Rows 16-byte (weight) and 8-byte (x) aligned, else the scalar loop takes the whole row.
  const bool vec = a.hidden % 4 == 0 && reinterpret_cast<uintptr_t>(a.router) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.x) % 8 == 0;
  const int vec_end = vec ? a.hidden : 0;
#pragma unroll 2
  for (int h = 4 * threadIdx.x; h < vec_end; h += 4 * blockDim.x) {
    const float4 wv = __ldg(reinterpret_cast<const float4*>(w + h));
#pragma unroll
    for (int i = 0; i < kSmallTokens; ++i) {
      if (i < nt) {
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(a.x + int64_t(t0 + i) * a.hidden + h));
        acc[i] += bf16_bits_to_f32(uint16_t(xv.x)) * wv.x + bf16_bits_to_f32(uint16_t(xv.x >> 16)) * wv.y +
                  bf16_bits_to_f32(uint16_t(xv.y)) * wv.z + bf16_bits_to_f32(uint16_t(xv.y >> 16)) * wv.w;
      }
    }
  }
  for (int h = vec_end + threadIdx.x; h < a.hidden; h += blockDim.x) {
    const float wv = w[h];
#pragma unroll
    for (int i = 0; i < kSmallTokens; ++i)
      if (i < nt) acc[i] += bf16_bits_to_f32(a.x[int64_t(t0 + i) * a.hidden + h]) * wv;
  }
  __shared__ float part[kSmallTokens][8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kSmallTokens; ++i) {
    const float s = warp_sum(acc[i]);
    if (lane == 0) part[i][warp] = s;
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += part[threadIdx.x][j];
    a.logits[int64_t(t0 + threadIdx.x) * a.num_experts + e] = s;
  }
  __syncthreads();  // part is rewritten by the next group
}

// Decode shape: one CTA per (expert, 8 tokens); threads stride over hidden four elements at a
// time (one 16-byte weight load, one 8-byte load per token row), the whole loop's loads
// independent. The 24 KB expert row is read from DRAM once and from L2 by the other token groups.
__global__ void __launch_bounds__(256) router_small_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  zero_expert_counts(a);
  // Token groups past the grid's y limit (batch-invariant prefill steps) come round again.
  for (int t0 = blockIdx.y * kSmallTokens; t0 < a.num_tokens; t0 += gridDim.y * kSmallTokens)
    router_small_group(a, t0);
}


// Prefill shape: the router GEMM on the tensor cores, as accurate as an fp32 dot product. Each
// fp32 weight splits exactly into three bf16 parts, hi = bf16(w), mid = bf16(w - hi),
// lo = bf16(w - hi - mid) (8 significant bits each cover fp32's 24; the differences are exact),
// and x is bf16 already, so every product x * part is exact in fp32 and bf16 MMAs with fp32
// accumulation sum the same terms an fp32 dot product sums, in another order: hi's products in one
// accumulator, mid's and lo's (2^-8 and 2^-16 smaller) in a second, added at the end. The SIMT fp32
// GEMM it replaced (a register-tiled kernel of 32 tokens x 128 experts a CTA) ran the M3.1 routing
// step (router, top-k, scan) of 2,048 / 8,192 tokens in 392 / 590 us on an H100, this one in
// 147 / 243 us (docs/gpu-backend-notes.md, "Session 31").
//
// A CTA takes 64 tokens x 64 experts, four warps of 32 x 32 (mma.sync m16n8k16: 2 x 4 tiles, each
// weight fragment split once and used by both token tiles). K advances 32 at a time through a
// three-stage cp.async ring; rows are padded to 80 (x) and 160 (weights) bytes so that ldmatrix and
// the weights' 8-byte fragment loads are free of bank conflicts.
constexpr int kRouterTokens = 64, kRouterExperts = 64, kRouterK = 32, kRouterStages = 3;
constexpr int kRouterThreads = 128;
constexpr int kRouterPitch = kRouterK + 8;  // elements of a shared row, x (bf16) and weights (fp32)

// The bf16 pairs (low half: the lower k) of hi, mid and lo for two consecutive weights.
__device__ __forceinline__ void split_bf16x3(float2 w, uint32_t (&part)[3]) {
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const __nv_bfloat162 b = __float22bfloat162_rn(w);
    part[j] = *reinterpret_cast<const uint32_t*>(&b);
    const float2 f = __bfloat1622float2(b);
    w = make_float2(__fsub_rn(w.x, f.x), __fsub_rn(w.y, f.y));
  }
}

__global__ void __launch_bounds__(kRouterThreads) router_mma_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  zero_expert_counts(a);
  __shared__ __align__(16) uint16_t xs[kRouterStages][kRouterTokens][kRouterPitch];
  __shared__ __align__(16) float ws[kRouterStages][kRouterExperts][kRouterPitch];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;  // the warp's tokens and experts in the tile
  const int e0 = blockIdx.x * kRouterExperts;
  const int k_steps = (a.hidden + kRouterK - 1) / kRouterK;
  // Token tiles past the grid's y limit come round again.
  for (int t0 = blockIdx.y * kRouterTokens; t0 < a.num_tokens; t0 += gridDim.y * kRouterTokens) {
    // Stage s of step kt: x rows of 4 16-byte chunks (2 a thread), weight rows of 8 (4 a thread);
    // rows past the tokens or experts and chunks past hidden (a multiple of 8) are zeros.
    auto load_stage = [&](int kt) {
      const int s = kt % kRouterStages, k0 = kt * kRouterK;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int id = tid + i * kRouterThreads, r = id >> 2, k = k0 + (id & 3) * 8;
        const bool ok = t0 + r < a.num_tokens && k < a.hidden;
        cp_async16_or_zero(smem_u32(&xs[s][r][(id & 3) * 8]), ok ? a.x + int64_t(t0 + r) * a.hidden + k : a.x, ok);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int id = tid + i * kRouterThreads, r = id >> 3, k = k0 + (id & 7) * 4;
        const bool ok = e0 + r < a.num_experts && k < a.hidden;
        cp_async16_or_zero(smem_u32(&ws[s][r][(id & 7) * 4]),
                           ok ? a.router + int64_t(e0 + r) * a.hidden + k : a.router, ok);
      }
    };
    float hi[2][4][4], rest[2][4][4];  // [token tile][expert tile][C fragment]
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) hi[m][n][c] = rest[m][n][c] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < kRouterStages - 1; ++kt) {
      if (kt < k_steps) load_stage(kt);
      cp_async_commit();
    }
    for (int kt = 0; kt < k_steps; ++kt) {
      cp_async_wait<kRouterStages - 2>();
      __syncthreads();  // stage kt landed for all; stage kt - 1 is free for step kt + 2
      if (kt + kRouterStages - 1 < k_steps) load_stage(kt + kRouterStages - 1);
      cp_async_commit();
      const int s = kt % kRouterStages;
#pragma unroll
      for (int kk = 0; kk < kRouterK; kk += 16) {
        uint32_t af[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldmatrix_x4(af[m], &xs[s][wm + 16 * m + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const float* wr = &ws[s][wn + 8 * n + g][kk + 2 * q];
          uint32_t b0[3], b1[3];
          split_bf16x3(*reinterpret_cast<const float2*>(wr), b0);
          split_bf16x3(*reinterpret_cast<const float2*>(wr + 8), b1);
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma_16816<true>(hi[m][n], af[m], b0[0], b1[0]);
            mma_16816<true>(rest[m][n], af[m], b0[1], b1[1]);
            mma_16816<true>(rest[m][n], af[m], b0[2], b1[2]);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next token tile's first stages overwrite this one's
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = t0 + wm + 16 * m + g + 8 * h;
        if (t >= a.num_tokens) continue;
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int e = e0 + wn + 8 * n + 2 * q + c;
            if (e < a.num_experts) a.logits[int64_t(t) * a.num_experts + e] = hi[m][n][2 * h + c] + rest[m][n][2 * h + c];
          }
      }
  }
}

// One warp, one token: sigmoid, biased top-k, normalised weights, choices sorted by expert id,
// per-held-expert counts in `counts` (the atomic's old value is the choice's rank inside its
// expert; -1 for an expert held elsewhere). `buf` is the warp's 2 x num_experts floats of shared
// memory. The logits are read through L2 (__ldcg): in the fused kernel other CTAs wrote them.
// `counts` is global memory (topk_kernel: the CTAs share it) or the fused kernel's shared memory.
__device__ void token_topk(const MoeRouteArgs& a, int t, float* buf, int* counts) {
  const int lane = threadIdx.x & 31;
  const int ne = a.num_experts;
  float* p = buf;
  float* choice = buf + ne;
  for (int e = lane; e < ne; e += 32) {
    const float l = __ldcg(a.logits + int64_t(t) * ne + e);
    const float s = 1.0f / (1.0f + expf(-l));
    p[e] = s;
    choice[e] = s + (a.bias != nullptr ? a.bias[e] : 0.0f);
  }
  __syncwarp();
  // Lane i keeps the i-th choice (in selection order) and later stores it.
  int mine = ne;
  for (int i = 0; i < a.top_k; ++i) {
    float best = -FLT_MAX;
    int best_e = ne;
    for (int e = lane; e < ne; e += 32) {
      const float c = choice[e];
      if (c > best || (c == best && e < best_e)) {
        best = c;
        best_e = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    if (lane == i) mine = best_e;
    if (lane == 0) choice[best_e] = -INFINITY;
    __syncwarp();
  }
  // The weights' sum in selection order (as the reference), the same on every lane; a choice's
  // place among the token's k is the number of chosen experts with a lower id.
  float sum = 0.0f;
  int place = 0;
  for (int j = 0; j < a.top_k; ++j) {
    const int e = __shfl_sync(0xffffffffu, mine, j);
    sum += p[e];
    place += e < mine;
  }
  if (lane < a.top_k) {
    const int64_t c = int64_t(t) * a.top_k + place;
    a.choice_expert[c] = mine;
    a.choice_weight[c] = p[mine] / sum;
    const int held = mine - a.first_expert;
    a.choice_row[c] = held >= 0 && held < a.held_experts ? atomicAdd(&counts[held], 1) : -1;
  }
  __syncwarp();  // the buffer is rewritten by the warp's next token
}

// One warp per token.
__global__ void __launch_bounds__(256) topk_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  extern __shared__ float topk_buf[];
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * 8 + warp;
  if (t < a.num_tokens) token_topk(a, t, topk_buf + warp * 2 * a.num_experts, a.expert_count);
}

// One CTA (a multiple of 32 threads): per-held-expert row offsets and the work items (scans over
// blockDim experts at a time), then the permuted row of every (token, choice) pair of a held expert.
// kSharedCounts: `counts` is this CTA's shared memory (the fused kernel), else global memory
// written by topk_kernel's atomics, read through L2.
template <bool kSharedCounts>
__device__ void scan_and_permute(const MoeRouteArgs& a, const int* counts) {
  __shared__ int row_offset[kMaxExperts];
  __shared__ int warp_sums[32];
  const int n = blockDim.x;
  int rows_before = 0, items_before = 0;
  for (int base = 0; base < a.held_experts; base += n) {
    const int e = base + threadIdx.x;
    const int count = e >= a.held_experts ? 0 : kSharedCounts ? counts[e] : __ldcg(counts + e);
    const int n_items = (count + a.item_rows - 1) / a.item_rows;
    int rows_total, items_total;
    const int first_row = rows_before + block_exclusive_scan(count, warp_sums, rows_total);
    const int first_item = items_before + block_exclusive_scan(n_items, warp_sums, items_total);
    if (e < a.held_experts) {
      row_offset[e] = first_row;
      for (int i = 0; i < n_items && first_item + i < a.max_items; ++i) {
        LinearItem item;
        item.expert = e;
        item.row_begin = first_row + i * a.item_rows;
        item.row_count = min(a.item_rows, count - i * a.item_rows);
        item.pad = 0;
        a.items[first_item + i] = item;
      }
    }
    rows_before += rows_total;
    items_before += items_total;
  }
  __syncthreads();  // row_offset of every expert
  if (threadIdx.x == 0) *a.num_items = min(items_before, a.max_items);
  for (int c = threadIdx.x; c < a.num_tokens * a.top_k; c += n) {
    const int rank_in_expert = a.choice_row[c];
    if (rank_in_expert < 0) continue;  // held elsewhere: stays -1
    const int row = row_offset[a.choice_expert[c] - a.first_expert] + rank_in_expert;
    a.choice_row[c] = row;
    a.row_token[row] = c / a.top_k;
  }
}

__global__ void __launch_bounds__(1024) scan_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  scan_and_permute<false>(a, a.expert_count);
}

// Decode steps (up to kFusedMaxTokens tokens) route in one launch instead of three: the router's
// CTAs as router_small_kernel, then the last CTA to finish (a counter in a.done, which that CTA
// sets back to zero, so a replayed graph finds it zero) runs the top-k of every token and the
// scan, counting the choices per expert in its own shared memory. Two kernel boundaries less a
// MoE layer, which at batch 1 cost more than the work.
__global__ void __launch_bounds__(256) route_fused_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  router_small_group(a, blockIdx.y * kSmallTokens);
  __shared__ bool last;
  __shared__ int counts[kMaxExperts];
  // This CTA's logits before its arrival, the other CTAs' after it: the barrier orders every
  // thread's stores before thread 0's acquire-release arrival (atomic_add_acq_rel_gpu), rather
  // than a full fence in every thread before and after.
  __syncthreads();
  if (threadIdx.x == 0) last = atomic_add_acq_rel_gpu(a.done, 1) == int(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  for (int e = threadIdx.x; e < a.held_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  extern __shared__ float topk_buf[];
  const int warp = threadIdx.x >> 5;
  for (int t = warp; t < a.num_tokens; t += blockDim.x / 32)
    token_topk(a, t, topk_buf + warp * 2 * a.num_experts, counts);
  __syncthreads();
  scan_and_permute<true>(a, counts);
  if (threadIdx.x == 0) *a.done = 0;
}

// kCols consecutive bf16 (16-byte aligned when kCols is 8).
template <int kCols>
__device__ __forceinline__ void load_cols(const uint16_t* p, uint16_t (&v)[kCols]) {
  if constexpr (kCols == 8) {
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int j = 0; j < kCols; ++j) v[j] = p[j];
  }
}
template <int kCols>
__device__ __forceinline__ void store_cols(uint16_t* p, const uint16_t (&v)[kCols]) {
  if constexpr (kCols == 8) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(v);
  } else {
#pragma unroll
    for (int j = 0; j < kCols; ++j) p[j] = v[j];
  }
}

// kShared: out = bf16(bf16(routed * scale) + shared); else bf16(routed * scale) (routed only).
// A thread takes kCols consecutive columns of a token (8: one 16-byte load per choice row).
template <bool kShared, int kCols>
__global__ void combine_kernel(const uint16_t* y, const int32_t* choice_row, const float* choice_weight, int num_tokens,
                               int top_k, int hidden, float routed_scale, const uint16_t* shared, uint16_t* out) {
  kernel_prologue();
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * kCols;
  if (c0 >= hidden) return;
  // Tokens past the grid's y limit (65535: prefill steps without chunking) come round again.
  for (int t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    float routed[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) routed[j] = 0.0f;
    for (int i = 0; i < top_k; ++i) {
      const int64_t ci = int64_t(t) * top_k + i;
      const int row = choice_row[ci];
      if (row < 0) continue;  // an expert held by another rank: its row was never written
      const float w = choice_weight[ci];
      alignas(16) uint16_t v[kCols];
      load_cols<kCols>(y + int64_t(row) * hidden + c0, v);
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        routed[j] = round_bf16(__fadd_rn(routed[j], round_bf16(__fmul_rn(bf16_bits_to_f32(v[j]), w))));
    }
    const int64_t o = int64_t(t) * hidden + c0;
    alignas(16) uint16_t s[kCols];
    alignas(16) uint16_t r[kCols];
    if constexpr (kShared) load_cols<kCols>(shared + o, s);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const float scaled = round_bf16(__fmul_rn(routed[j], routed_scale));
      r[j] = f32_to_bf16_bits(kShared ? __fadd_rn(scaled, bf16_bits_to_f32(s[j])) : scaled);
    }
    store_cols<kCols>(out + o, r);
  }
}

// xp[choice_row[c]] = x[c / top_k] for every choice of a held expert: the routed rows in their
// permuted order, contiguous, for the grouped gate/up GEMM's TMA copies. Driven by the choices,
// not by row_token as launch_gather_rows would be: under expert parallelism only the device knows
// how many permuted rows there are, and the row_token entries past them are stale. One CTA a
// choice, 16 bytes a thread (hidden a multiple of 8, rows 16-byte aligned).
__global__ void __launch_bounds__(256) permute_routed_rows_kernel(const uint16_t* x, int hidden, const int32_t* choice_row,
                                                          int64_t pairs, int top_k, uint16_t* xp) {
  kernel_prologue();
  for (int64_t c = blockIdx.x; c < pairs; c += gridDim.x) {
    const int row = choice_row[c];
    if (row < 0) continue;
    const uint4* src = reinterpret_cast<const uint4*>(x + (c / top_k) * hidden);
    uint4* dst = reinterpret_cast<uint4*>(xp + int64_t(row) * hidden);
    for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.num_experts > kMaxExperts || a.top_k > 16 || a.top_k > a.num_experts) return cudaErrorInvalidValue;
  if (a.first_expert < 0 || a.held_experts < 1 || a.first_expert + a.held_experts > a.num_experts)
    return cudaErrorInvalidValue;
  const size_t topk_smem = size_t(8) * 2 * a.num_experts * sizeof(float);
  if (a.num_tokens <= kFusedMaxTokens && a.done != nullptr) {
    const int groups = (a.num_tokens + kSmallTokens - 1) / kSmallTokens;
    return launch_kernel(route_fused_kernel, dim3(a.num_experts, groups), 256, topk_smem, stream, a);
  }
  // The MMA router's 16-byte copies need 16-byte aligned rows.
  const bool mma_ok = a.hidden % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.router) % 16 == 0;
  if (a.num_tokens <= kMoeSmallRouterMaxTokens || a.batch_invariant || !mma_ok) {
    const int groups = std::min((a.num_tokens + kSmallTokens - 1) / kSmallTokens, kMaxGridY);
    launch_kernel(router_small_kernel, dim3(a.num_experts, groups), 256, 0, stream, a);
  } else {
    launch_kernel(router_mma_kernel,
                  dim3((a.num_experts + kRouterExperts - 1) / kRouterExperts,
                       std::min((a.num_tokens + kRouterTokens - 1) / kRouterTokens, kMaxGridY)),
                  kRouterThreads, 0, stream, a);
  }
  launch_kernel(topk_kernel, (a.num_tokens + 7) / 8, 256, topk_smem, stream, a);
  launch_kernel(scan_kernel, 1, 1024, 0, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(const uint16_t* y, const int32_t* choice_row, const float* choice_weight,
                               int num_tokens, int top_k, int hidden, float routed_scale, const uint16_t* shared,
                               uint16_t* out, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int rows_y = std::min(num_tokens, kMaxGridY);
  const bool wide = hidden % 8 == 0 &&
                    ((reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(shared) |
                      reinterpret_cast<uintptr_t>(out)) % 16) == 0;
  if (wide) {
    const dim3 grid((hidden / 8 + 127) / 128, rows_y);
    auto* kernel = shared != nullptr ? combine_kernel<true, 8> : combine_kernel<false, 8>;
    launch_kernel(kernel, grid, 128, 0, stream, y, choice_row, choice_weight, num_tokens, top_k, hidden, routed_scale,
                  shared, out);
  } else {
    const dim3 grid((hidden + 255) / 256, rows_y);
    auto* kernel = shared != nullptr ? combine_kernel<true, 1> : combine_kernel<false, 1>;
    launch_kernel(kernel, grid, 256, 0, stream, y, choice_row, choice_weight, num_tokens, top_k, hidden, routed_scale,
                  shared, out);
  }
  return cudaGetLastError();
}

cudaError_t launch_moe_gate_up(LinearArgs a, const MoeRouteArgs& r, uint16_t* gathered, cudaStream_t stream) {
  const bool contiguous_ok = linear_runs_wgmma(a) && gathered != nullptr && a.x_rows != nullptr && a.x_stride == a.k &&
                             a.k % 8 == 0 &&
                             ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(gathered)) % 16) == 0;
  if (contiguous_ok) {
    const int64_t pairs = int64_t(r.num_tokens) * r.top_k;
    launch_kernel(permute_routed_rows_kernel, dim3(static_cast<unsigned>(std::min<int64_t>(pairs, 1 << 30))), 256, 0, stream,
                  a.x, a.k, r.choice_row, pairs, r.top_k, gathered);
    a.x = gathered;
    a.x_rows = nullptr;
  }
  return launch_linear(a, stream);
}

}  // namespace m3::cuda::detail
