// The fused attention input path: after the Q/K/V (+ index-K, index-q) projections, one launch
// applies the per-head Gemma norms and partial RoPE and writes K, V and index-K quantized into the
// paged cache. Unfused, the same work takes four head_norm_rope launches and kv_insert, each reading and
// writing the rows again; here every row is read once, normed and roped, and written once (to the
// activation, and encoded to the cache). Results are bit-identical to the separate ops (the same
// operations in the same order as row_ops.cuh's).
//
// A warp takes one row (a head of one token) at a time and walks several rows of its token, so
// that the per-token setup (cache slot, RoPE table entries) is paid once a warp. Rows of 128
// (the M3 heads) stay in registers: lane l holds elements l + 32 i, the order in which
// row_ops.cuh's loops visit them, so every sum and rounding is the same; the RoPE pairs (c,
// c + half) sit in one lane when half is a multiple of 32. Other shapes take the shared-memory
// row functions. Before, one warp a row, through shared memory: on an H100 the M3.1 layer's
// 8192-token prefill took 977 us here, instruction-bound (docs/gpu-backend-notes.md, "Session 31");
// 615 us before session 40, which made the cache encoder's scale search division-free, the bf16
// roundings the conversion instruction, and the register path load a warp's next row ahead.
#include <algorithm>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/row_ops.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kRegDim = 128;                // row width of the register path
constexpr int kRegSlots = kRegDim / 32;     // elements a lane holds
// CTAs wanted before a token's row groups merge (from 16,384 tokens one CTA a token). At 8,192
// tokens a token keeps two row groups, so the 9 rows it encodes to the cache (K, V, index-K) fall
// on 9 different warps; with one CTA a token, one warp took two of them and held its CTA
// (docs/gpu-backend-notes.md, "Session 31" and "Session 33").
constexpr int kTargetCtas = 16384;

// The RoPE table entries of a lane's pairs for one rotated width: slot s < half_slots pairs with
// slot s + half_slots (channels c = lane + 32 s and c + half).
struct LaneRope {
  int half_slots = 0;  // rope_dims / 64: 0 (no rotation), 1 or 2
  float cos0[2], sin0[2], cos1[2], sin1[2];
};

__device__ __forceinline__ LaneRope lane_rope(int rope_dims, const float* cos_row, const float* sin_row, int rope_half) {
  LaneRope r;
  r.half_slots = rope_dims / 64;
  const int lane = threadIdx.x & 31, half = rope_dims / 2;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    r.cos0[s] = r.sin0[s] = r.cos1[s] = r.sin1[s] = 0.0f;
    if (s < r.half_slots) {
      const int c = lane + 32 * s, j0 = c % rope_half, j1 = (c + half) % rope_half;
      r.cos0[s] = cos_row[j0];
      r.sin0[s] = sin_row[j0];
      r.cos1[s] = cos_row[j1];
      r.sin1[s] = sin_row[j1];
    }
  }
  return r;
}

__device__ __forceinline__ void load_row(const uint16_t* src, float (&v)[kRegSlots]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kRegSlots; ++i) v[i] = bf16_bits_to_f32(src[lane + 32 * i]);
}

__device__ __forceinline__ void store_row(const float (&v)[kRegSlots], uint16_t* dst) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kRegSlots; ++i) dst[lane + 32 * i] = f32_to_bf16_bits(v[i]);
}

// warp_rms_norm_inplace + warp_rope_inplace on the registers (row_ops.cuh's arithmetic).
__device__ __forceinline__ void norm_rope_row(float (&v)[kRegSlots], const float* w, float eps, const LaneRope& rope) {
  const int lane = threadIdx.x & 31;
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kRegSlots; ++i) ss += double(v[i]) * double(v[i]);
  ss = warp_sum(ss);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / kRegDim), eps)));
#pragma unroll
  for (int i = 0; i < kRegSlots; ++i) v[i] = round_bf16(__fmul_rn(__fmul_rn(v[i], r), __fadd_rn(1.0f, w[lane + 32 * i])));
  // Pairs (slot s, slot s + half_slots); the slots are compile-time register indices.
  auto rotate = [&](float& a, float& b, int s) {
    const float x0 = round_bf16(__fadd_rn(round_bf16(__fmul_rn(a, rope.cos0[s])), round_bf16(__fmul_rn(-b, rope.sin0[s]))));
    const float x1 = round_bf16(__fadd_rn(round_bf16(__fmul_rn(b, rope.cos1[s])), round_bf16(__fmul_rn(a, rope.sin1[s]))));
    a = x0;
    b = x1;
  };
  if (rope.half_slots == 1) {
    rotate(v[0], v[1], 0);
  } else if (rope.half_slots == 2) {
    rotate(v[0], v[2], 0);
    rotate(v[1], v[3], 1);
  }
}

// The row to the warp's shared buffer, for the cache encoder (which reads it in its own layout).
__device__ __forceinline__ void stage_row(const float (&v)[kRegSlots], float* buf) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kRegSlots; ++i) buf[lane + 32 * i] = v[i];
  __syncwarp();
}

// One rotated width's RoPE for a token: its table rows (the shared-memory path) and the lane's
// entries (the register path).
struct TokenRope {
  int dims;
  const float* cos_row;
  const float* sin_row;
  int table_half;
  LaneRope lane;
};

// What one row task does: row `task` of token t is a q head, a k head, a v head, the index-K row or
// an index-q head, in that order. Every row but V's is normed (and roped) in place; K, V and
// index-K rows of cached tokens are also encoded to the cache.
struct RowTask {
  const uint16_t* src = nullptr;  // the row; null: nothing to do (the V row of an uncached token)
  uint16_t* dst = nullptr;        // where the normed row goes (src's row); null: no norm (V)
  const float* norm = nullptr;
  bool index_rope = false;  // the index rows' RoPE width, else the heads'
  int dim = 0;
  KvDType dtype = KvDType::kBF16;  // the cache row's, when data is not null
  uint8_t* data = nullptr;
  uint8_t* scales = nullptr;
};

__device__ __forceinline__ RowTask row_task(const AttentionInputArgs& a, int t, int task, int32_t slot, int64_t block,
                                            int row) {
  const KvLayerView& c = a.cache;
  const int hq = a.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int ik_tasks = a.index_k != nullptr ? 1 : 0;
  const bool cached = slot >= 0;
  RowTask r;
  if (task < hq) {
    r.dst = a.q + (int64_t(t) * hq + task) * d;
    r.norm = a.q_norm, r.dim = d;
  } else if (task < hq + hkv) {
    const int head = task - hq;
    r.dst = a.k + (int64_t(t) * hkv + head) * d;
    r.norm = a.k_norm, r.dim = d;
    if (cached) r.dtype = c.kv_dtype, r.data = c.kv_row(block, 0, head, row), r.scales = c.kv_row_scales(block, 0, head, row);
  } else if (task < hq + 2 * hkv) {
    const int head = task - hq - hkv;
    if (!cached) return r;
    r.src = a.v + (int64_t(t) * hkv + head) * d, r.dim = d;
    r.dtype = c.kv_dtype, r.data = c.kv_row(block, 1, head, row), r.scales = c.kv_row_scales(block, 1, head, row);
    return r;
  } else if (task >= hq + 2 * hkv + ik_tasks) {
    const int head = task - hq - 2 * hkv - ik_tasks;
    r.dst = a.index_q + (int64_t(t) * a.index_heads + head) * c.index_dim;
    r.norm = a.index_q_norm, r.index_rope = true, r.dim = c.index_dim;
  } else {
    r.dst = a.index_k + int64_t(t) * c.index_dim;
    r.norm = a.index_k_norm, r.index_rope = true, r.dim = c.index_dim;
    if (cached) r.dtype = c.index_dtype, r.data = c.index_row(block, row), r.scales = c.index_row_scales(block, row);
  }
  r.src = r.dst;
  return r;
}

// x or y, field by field (a select of the whole struct would put both in local memory).
__device__ __forceinline__ LaneRope pick_rope(bool take_x, const LaneRope& x, const LaneRope& y) {
  LaneRope r;
  r.half_slots = take_x ? x.half_slots : y.half_slots;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    r.cos0[s] = take_x ? x.cos0[s] : y.cos0[s];
    r.sin0[s] = take_x ? x.sin0[s] : y.sin0[s];
    r.cos1[s] = take_x ? x.cos1[s] : y.cos1[s];
    r.sin1[s] = take_x ? x.sin1[s] : y.sin1[s];
  }
  return r;
}

// A row task on the register path, its row already loaded into v (by the loop, a row ahead).
__device__ __forceinline__ void run_row_regs(const AttentionInputArgs& a, const RowTask& r, float (&v)[kRegSlots],
                                             float* buf, const TokenRope& rope, const TokenRope& index_rope) {
  if (r.dst != nullptr) {
    norm_rope_row(v, r.norm, a.eps, pick_rope(r.index_rope, index_rope.lane, rope.lane));
    store_row(v, r.dst);
  }
  if (r.data != nullptr) {
    stage_row(v, buf);
    warp_encode_row(r.dtype, buf, r.dim, r.data, r.scales);
  }
  __syncwarp();  // buf is rewritten by the warp's next row
}

// A row task on the shared-memory path (other shapes).
__device__ __forceinline__ void run_row_smem(const AttentionInputArgs& a, const RowTask& r, float* buf,
                                             const TokenRope& rope, const TokenRope& index_rope) {
  if (r.src == nullptr) return;
  if (r.dst != nullptr) {
    const TokenRope& tr = r.index_rope ? index_rope : rope;
    warp_head_norm_rope(r.src, r.dst, buf, r.dim, r.norm, a.eps, tr.dims, tr.cos_row, tr.sin_row, tr.table_half);
  } else {
    warp_load_bf16(r.src, buf, r.dim);
  }
  if (r.data != nullptr) warp_encode_row(r.dtype, buf, r.dim, r.data, r.scales);
  __syncwarp();
}

// CTAs (token, group of rows); warp w of group y takes rows y * kWarps + w, stepping by
// gridDim.y * kWarps. On the register path a warp loads its next row before it works on the current
// one: the row loads' latency was the largest stall of the 8K prompt's launch (16% of ncu's samples,
// session 40). Three CTAs an SM at 80 registers (with the cache encoder's search a call, 128 would
// leave two).
template <bool kRegs>
__global__ void __launch_bounds__(kWarps * 32, 3) attention_input_kernel(const AttentionInputArgs a) {
  kernel_prologue();
  extern __shared__ float rows_buf[];
  const KvLayerView& c = a.cache;
  const int t = blockIdx.x, warp = threadIdx.x >> 5;
  const int width = c.head_dim > c.index_dim ? c.head_dim : c.index_dim;
  float* buf = rows_buf + warp * width;
  const int tasks = a.num_q_heads + 2 * c.num_kv_heads + (a.index_k != nullptr ? 1 : 0) +
                    (a.index_q != nullptr ? a.index_heads : 0);
  const int first = blockIdx.y * kWarps + warp, stride = gridDim.y * kWarps;
  if (first >= tasks) return;
  const float* cos_row = a.cos + int64_t(t) * a.rope_half;
  const float* sin_row = a.sin + int64_t(t) * a.rope_half;
  const int32_t slot = a.step.slot_mapping[t];
  const int64_t block = slot / c.block_size;
  const int row = slot % c.block_size;
  TokenRope rope{a.rope_dims, cos_row, sin_row, a.rope_half, {}};
  TokenRope index_rope{a.index_rope_dims, cos_row, sin_row, a.rope_half, {}};
  if constexpr (kRegs) {
    rope.lane = lane_rope(a.rope_dims, cos_row, sin_row, a.rope_half);
    index_rope.lane = lane_rope(a.index_rope_dims, cos_row, sin_row, a.rope_half);
    // Only the next row's address is kept across the current row (its other fields are made again
    // when it runs), so that the prefetch costs its four values and a pointer of registers.
    float v[kRegSlots] = {};
    const uint16_t* src = row_task(a, t, first, slot, block, row).src;
    if (src != nullptr) load_row(src, v);
    for (int task = first; task < tasks; task += stride) {
      float next[kRegSlots] = {};
      const uint16_t* next_src = task + stride < tasks ? row_task(a, t, task + stride, slot, block, row).src : nullptr;
      if (next_src != nullptr) load_row(next_src, next);
      const RowTask cur = row_task(a, t, task, slot, block, row);
      if (cur.src != nullptr) run_row_regs(a, cur, v, buf, rope, index_rope);
#pragma unroll
      for (int i = 0; i < kRegSlots; ++i) v[i] = next[i];
    }
  } else {
    for (int task = first; task < tasks; task += stride) run_row_smem(a, row_task(a, t, task, slot, block, row), buf, rope, index_rope);
  }
}

}  // namespace

cudaError_t launch_attention_input(const AttentionInputArgs& a, cudaStream_t stream) {
  const int tokens = a.step.num_tokens;
  if (tokens == 0) return cudaSuccess;
  const KvLayerView& c = a.cache;
  const int width = c.head_dim > c.index_dim ? c.head_dim : c.index_dim;
  const int tasks = a.num_q_heads + 2 * c.num_kv_heads + (a.index_k != nullptr ? 1 : 0) +
                    (a.index_q != nullptr ? a.index_heads : 0);
  // Enough CTAs for the GPU at decode sizes (one row a warp); few row groups a token in prefill.
  const int groups = (tasks + kWarps - 1) / kWarps;
  const int y = std::max(1, std::min(groups, (kTargetCtas + tokens - 1) / tokens));
  const bool index_rows = a.index_k != nullptr || a.index_q != nullptr;
  const bool regs = c.head_dim == kRegDim && (!index_rows || c.index_dim == kRegDim) && a.rope_dims % 64 == 0 &&
                    a.rope_dims <= kRegDim && (!index_rows || (a.index_rope_dims % 64 == 0 && a.index_rope_dims <= kRegDim));
  auto* kernel = regs ? attention_input_kernel<true> : attention_input_kernel<false>;
  launch_kernel(kernel, dim3(tokens, y), kWarps * 32, kWarps * width * sizeof(float), stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
