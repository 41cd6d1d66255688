// MoE routing on the GPU: router logits (fp32 weight, fp32 accumulation), sigmoid + bias top-k
// (ties to the lower expert id) and normalisation as the CPU reference, the permutation of the
// (token, choice) pairs into rows grouped by expert with the grouped GEMM's work items, and the
// weighted combine in ascending expert id with the reference's bf16 roundings.
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
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kSmallTokens = 8;    // tokens per CTA of the decode-shaped router kernel
constexpr int kSmallMaxTokens = 256;  // the decode-shaped kernel up to here, the tiled one above
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


// Prefill shape: a register-tiled fp32 GEMM on the SIMT pipes (fp32 products and sums, as the
// reference's). A CTA of 128 threads takes 32 tokens x 128 experts, a thread 4 tokens x 8 experts
// (tokens tt + 8 i, experts te + 16 j: the 16 lanes of a half-warp read 16 different expert rows,
// which a row pitch of 36 floats spreads over all banks, and 2 token rows, broadcast). K advances
// 32 at a time through shared memory, the next 32's global loads in flight in registers during
// the current 32's FMAs. Every logit sums its K in order, one FMA at a time (as the decode-shaped
// kernel's lanes do within their part of K). The kernel it replaced (64 x 32 outputs a CTA, one
// shared-memory load per FMA) ran at 8.4 TFLOP/s: on an H100 the M3.1 routing step (router, top-k,
// scan) of 2,048 / 8,192 tokens took 1,135 / 1,457 us with it, 385 / 573 us with this one
// (docs/gpu-backend-notes.md, "Session 26").
constexpr int kRouterTokens = 32, kRouterExperts = 128, kRouterK = 32, kRouterPitch = kRouterK + 4;
constexpr int kRouterThreads = 128;

__global__ void __launch_bounds__(kRouterThreads, 3) router_tiled_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  zero_expert_counts(a);
  __shared__ __align__(16) float xs[kRouterTokens][kRouterPitch];
  __shared__ __align__(16) float ws[kRouterExperts][kRouterPitch];
  const int e0 = blockIdx.x * kRouterExperts, t0 = blockIdx.y * kRouterTokens;
  const int tid = threadIdx.x, tt = tid >> 4, te = tid & 15;
  // Global loads: x row tid / 4, 8 bf16 at (tid % 4) * 8; router rows tid / 8 + 16 i, 4 floats at
  // (tid % 8) * 4 (a row's 32 floats by 8 lanes: whole 128-byte lines).
  const int xr = tid >> 2, xc = (tid & 3) * 8, wr = tid >> 3, wc = (tid & 7) * 4;
  const bool vec = a.hidden % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.router) % 16 == 0;
  float xv[8];
  float4 wv[8];
  auto load = [&](int k0) {
    const int t = t0 + xr;
    if (vec) {
      const bool ok = t < a.num_tokens && k0 + xc < a.hidden;
      const uint4 raw = ok ? *reinterpret_cast<const uint4*>(a.x + int64_t(t) * a.hidden + k0 + xc) : make_uint4(0, 0, 0, 0);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xv[2 * i] = __uint_as_float(w[i] << 16);
        xv[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = k0 + xc + i;
        xv[i] = t < a.num_tokens && k < a.hidden ? bf16_bits_to_f32(a.x[int64_t(t) * a.hidden + k]) : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = e0 + wr + 16 * i;
      const float* row = a.router + int64_t(e) * a.hidden + k0 + wc;
      if (vec && e < a.num_experts && k0 + wc < a.hidden) {
        wv[i] = *reinterpret_cast<const float4*>(row);
      } else {
        float f[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) f[c] = e < a.num_experts && k0 + wc + c < a.hidden ? row[c] : 0.0f;
        wv[i] = make_float4(f[0], f[1], f[2], f[3]);
      }
    }
  };
  float acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  load(0);
  for (int k0 = 0; k0 < a.hidden; k0 += kRouterK) {
    *reinterpret_cast<float4*>(&xs[xr][xc]) = make_float4(xv[0], xv[1], xv[2], xv[3]);
    *reinterpret_cast<float4*>(&xs[xr][xc + 4]) = make_float4(xv[4], xv[5], xv[6], xv[7]);
#pragma unroll
    for (int i = 0; i < 8; ++i) *reinterpret_cast<float4*>(&ws[wr + 16 * i][wc]) = wv[i];
    __syncthreads();
    if (k0 + kRouterK < a.hidden) load(k0 + kRouterK);
#pragma unroll 2
    for (int kk = 0; kk < kRouterK; kk += 4) {
      float4 x4[4], w4[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) x4[i] = *reinterpret_cast<const float4*>(&xs[tt + 8 * i][kk]);
#pragma unroll
      for (int j = 0; j < 8; ++j) w4[j] = *reinterpret_cast<const float4*>(&ws[te + 16 * j][kk]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[i][j] = fmaf(x4[i].x, w4[j].x, acc[i][j]);
          acc[i][j] = fmaf(x4[i].y, w4[j].y, acc[i][j]);
          acc[i][j] = fmaf(x4[i].z, w4[j].z, acc[i][j]);
          acc[i][j] = fmaf(x4[i].w, w4[j].w, acc[i][j]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = t0 + tt + 8 * i;
    if (t >= a.num_tokens) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = e0 + te + 16 * j;
      if (e < a.num_experts) a.logits[int64_t(t) * a.num_experts + e] = acc[i][j];
    }
  }
}

// One warp, one token: sigmoid, biased top-k, normalised weights, choices sorted by expert id,
// per-held-expert counts (the atomic's old value is the choice's rank inside its expert; -1 for
// an expert held elsewhere). `buf` is the warp's 2 x num_experts floats of shared memory. The
// logits are read through L2 (__ldcg): in the fused kernel other CTAs wrote them.
__device__ void token_topk(const MoeRouteArgs& a, int t, float* buf) {
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
  int sel[16];
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
    sel[i] = best_e;
    if (lane == 0) choice[best_e] = -INFINITY;
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int i = 0; i < a.top_k; ++i) sum += p[sel[i]];
    float wts[16];
    for (int i = 0; i < a.top_k; ++i) wts[i] = p[sel[i]] / sum;
    // Insertion sort by expert id (k <= 16).
    for (int i = 1; i < a.top_k; ++i) {
      const int e = sel[i];
      const float wv = wts[i];
      int j = i - 1;
      while (j >= 0 && sel[j] > e) {
        sel[j + 1] = sel[j];
        wts[j + 1] = wts[j];
        --j;
      }
      sel[j + 1] = e;
      wts[j + 1] = wv;
    }
    for (int i = 0; i < a.top_k; ++i) {
      const int64_t c = int64_t(t) * a.top_k + i;
      a.choice_expert[c] = sel[i];
      a.choice_weight[c] = wts[i];
      const int held = sel[i] - a.first_expert;
      a.choice_row[c] = held >= 0 && held < a.held_experts ? atomicAdd(&a.expert_count[held], 1) : -1;
    }
  }
  __syncwarp();  // the buffer is rewritten by the warp's next token
}

// One warp per token.
__global__ void __launch_bounds__(256) topk_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  extern __shared__ float topk_buf[];
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * 8 + warp;
  if (t < a.num_tokens) token_topk(a, t, topk_buf + warp * 2 * a.num_experts);
}

// One CTA (any width): per-held-expert row offsets and the work items (inclusive scans in shared
// memory, blockDim experts at a time), then the permuted row of every (token, choice) pair of a
// held expert. Counts are read through L2 (the atomics of token_topk).
__device__ void scan_and_permute(const MoeRouteArgs& a) {
  __shared__ int rows_scan[1024];
  __shared__ int items_scan[1024];
  __shared__ int row_offset[kMaxExperts];
  const int n = blockDim.x;
  int rows_before = 0, items_before = 0;
  for (int base = 0; base < a.held_experts; base += n) {
    const int e = base + threadIdx.x;
    const int count = e < a.held_experts ? __ldcg(a.expert_count + e) : 0;
    const int n_items = (count + a.item_rows - 1) / a.item_rows;
    rows_scan[threadIdx.x] = count;
    items_scan[threadIdx.x] = n_items;
    __syncthreads();
    for (int o = 1; o < n; o <<= 1) {
      const int r = threadIdx.x >= o ? rows_scan[threadIdx.x - o] : 0;
      const int i = threadIdx.x >= o ? items_scan[threadIdx.x - o] : 0;
      __syncthreads();
      rows_scan[threadIdx.x] += r;
      items_scan[threadIdx.x] += i;
      __syncthreads();
    }
    const int first_row = rows_before + rows_scan[threadIdx.x] - count;
    const int first_item = items_before + items_scan[threadIdx.x] - n_items;
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
    rows_before += rows_scan[n - 1];
    items_before += items_scan[n - 1];
    __syncthreads();  // the scans are rewritten by the next experts
  }
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
  scan_and_permute(a);
}

// Decode steps (up to kFusedMaxTokens tokens) route in one launch instead of three: the router's
// CTAs as router_small_kernel, then the last CTA to finish (a counter in a.done, which that CTA
// sets back to zero, so a replayed graph finds it zero) runs the top-k of every token and the
// scan. Two kernel boundaries less a MoE layer, which at batch 1 cost more than the work.
__global__ void __launch_bounds__(256) route_fused_kernel(const MoeRouteArgs a) {
  kernel_prologue();
  zero_expert_counts(a);
  router_small_group(a, blockIdx.y * kSmallTokens);
  __shared__ bool last;
  __threadfence();  // this CTA's logits (and zeroed counts) before its arrival
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.done, 1) == int(gridDim.x * gridDim.y) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  extern __shared__ float topk_buf[];
  const int warp = threadIdx.x >> 5;
  for (int t = warp; t < a.num_tokens; t += blockDim.x / 32) token_topk(a, t, topk_buf + warp * 2 * a.num_experts);
  __syncthreads();
  scan_and_permute(a);
  if (threadIdx.x == 0) *a.done = 0;
}

// kShared: out = bf16(bf16(routed * scale) + shared); else bf16(routed * scale) (routed only).
template <bool kShared>
__global__ void combine_kernel(const uint16_t* y, const int32_t* choice_row, const float* choice_weight, int num_tokens,
                               int top_k, int hidden, float routed_scale, const uint16_t* shared, uint16_t* out) {
  kernel_prologue();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  // Tokens past the grid's y limit (65535: prefill steps without chunking) come round again.
  for (int t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    float routed = 0.0f;
    for (int i = 0; i < top_k; ++i) {
      const int64_t ci = int64_t(t) * top_k + i;
      const int row = choice_row[ci];
      if (row < 0) continue;  // an expert held by another rank: its row was never written
      const float v = bf16_bits_to_f32(y[int64_t(row) * hidden + c]);
      routed = round_bf16(__fadd_rn(routed, round_bf16(__fmul_rn(v, choice_weight[ci]))));
    }
    const int64_t o = int64_t(t) * hidden + c;
    const float scaled = round_bf16(__fmul_rn(routed, routed_scale));
    out[o] = f32_to_bf16_bits(kShared ? __fadd_rn(scaled, bf16_bits_to_f32(shared[o])) : scaled);
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
  if (a.num_tokens <= kSmallMaxTokens || a.batch_invariant) {
    const int groups = std::min((a.num_tokens + kSmallTokens - 1) / kSmallTokens, kMaxGridY);
    launch_kernel(router_small_kernel, dim3(a.num_experts, groups), 256, 0, stream, a);
  } else {
    launch_kernel(router_tiled_kernel, dim3((a.num_experts + kRouterExperts - 1) / kRouterExperts,
                                            (a.num_tokens + kRouterTokens - 1) / kRouterTokens),
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
  const dim3 grid((hidden + 255) / 256, std::min(num_tokens, kMaxGridY));
  auto* kernel = shared != nullptr ? combine_kernel<true> : combine_kernel<false>;
  launch_kernel(kernel, grid, 256, 0, stream, y, choice_row, choice_weight, num_tokens, top_k, hidden, routed_scale, shared, out);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
