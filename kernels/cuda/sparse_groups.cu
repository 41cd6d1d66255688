// Sparse attention of a row group (2-4 query rows of one sequence: prefill chunks) over an NVFP4
// KV cache (Q8KV4), on wgmma. One CTA per (group, KV head, part): a consumer warpgroup that
// multiplies and a producer warpgroup that copies and decodes.
//
// The rows' selected blocks are merged into their sorted union (sparse_union.cuh) and the CTA walks
// its part of the union once for all rows, each 64-token tile decoded once for 4 rows x 16 heads =
// 64 query columns (column 16r + h: row r, head h):
//   S[64 columns][64 keys] = Q' K'^T   wgmma m64n64k16 x 8 in fp16: Q' = E4M3(q) as register A
//        fragments loaded once, K' the tile's keys decoded to their E4M3 view and widened to fp16
//        (exact) in shared memory. fp16, not E4M3 MMAs: Hopper's FP8 sums are off by up to
//        ~1e-3 of the sum of |products| (msa_bench --fp8-mma-probe), and scores that far off
//        move P8's roundings (and the LSE of rows with few keys) outside the reference's
//        tolerance;
//   per column the mask (keys past the row; tiles the row did not select), the running maximum
//        and P8 = E4M3(448 exp(s - m)), packed straight into register A fragments. Warp r holds
//        the 16 columns of row r, so the softmax needs no exchange between warps, and a warp whose
//        row did not select the tile skips it (its P8 is zero);
//   O[64 columns][128 dims] += P8 V'   wgmma m64n128k32 x 2 (E4M3: P8 and V' are E4M3 values),
//        V' decoded and transposed into shared memory with its keys in the order of P8's
//        fragments (group_vt_offset).
// Warp specialisation: the producer warpgroup copies the raw tiles (three cp.async stages) and
// decodes K' and V'^T into a ring of kBuffers buffers while the consumer warpgroup runs the MMAs
// and the softmax of an earlier one; they hand the buffers over by named barriers (full: decoded;
// empty: the consumer's MMAs are done with it). The producer runs at 64 registers, the consumer at
// 192 (setmaxnreg), two CTAs a multiprocessor. When one warpgroup did both (until session 38), each
// tile's decode, MMAs and softmax ran behind full waits and two CTA barriers: 7-20% slower on the
// prefill suite. Three buffers measured 1% slower than two. Every wgmma wait is still a full one:
// ptxas serialises wgmma when a wait leaves some pending in this loop. A tile costs all 64 columns
// of the group's rows, also those of rows that did not select it, but the walk's pace is the
// producer's (session 39's probes: its copies and decode alone took 2.2 of the walk's 2.77 ms on a
// 16K-row chunk), and a consumer that multiplied each tile by the selecting rows only (3.6x fewer
// MMAs) made the walk slower (docs/msa-kernels-notes.md "v10", "v11", "v12").
//
// Numerics (ops/attention.h Q8KV4): a row meets its own tiles in ascending order, 64 keys at a
// time (a tile it did not select adds exact zeros and leaves its maximum alone); its running
// maximum sets P8's scale, the normaliser sums the unquantised 448 exp(.).
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sparse_nvfp4.cuh"
#include "kernels/cuda/sparse_union.cuh"

namespace m3::cuda::detail {
namespace {

using namespace sparse_nvfp4;

// K': 64 keys x 128 fp16 (wgmma_f16_offset).
constexpr int kKtBytes = 64 * kDim * 2;
// V'^T: per key half (32 keys) 16 dim groups of 8 dims x 2 key chunks of 16 (LBO 128 along keys,
// SBO 272 along dims: a warp's transposed stores spread over the banks).
constexpr int kGroupVtSbo = 272, kGroupVtHalf = 16 * kGroupVtSbo, kGroupVtBytes = 2 * kGroupVtHalf;
// cp.async stages: 3 keep two tiles in flight while one is decoded; kBuffers decoded buffers (K'
// and V'^T) let the producer run up to kBuffers - 1 tiles ahead of the consumer.
constexpr int kGroupStages = 3;
constexpr int kBuffers = 2;
constexpr int kListBytes = (3 * kMaxGroupCandidates + kMaxGroupCandidates * kMaxTilesPerBlock) * 4;
constexpr int kSmemBytes =
    kTableBytes + kBuffers * (kKtBytes + kGroupVtBytes) + kGroupStages * kStageBytes + kListBytes;
// The CTA: the consumer warpgroup (threads 0-127, warp r owns row r) and the producer's.
constexpr int kCtaThreads = 2 * kThreads;
constexpr int kProducerRegisters = 64, kConsumerRegisters = 192;  // x 128 threads: two CTAs an SM
static_assert(kThreads * (kProducerRegisters + kConsumerRegisters) * 2 <= 65536, "two CTAs a multiprocessor");
// Named barriers: buffer b decoded (kFullBarrier + b), buffer b free again (kEmptyBarrier + b),
// the producer warpgroup alone.
constexpr int kFullBarrier = 1, kEmptyBarrier = kFullBarrier + kBuffers, kProducerBarrier = kEmptyBarrier + kBuffers;
static_assert(kBuffers == 2, "buffer_barrier names two buffers' ids");

// The CTA's barrier kBase + b (b < kBuffers), synced or arrived at: ids must be immediates.
template <int kBase, bool kArrive>
__device__ __forceinline__ void buffer_barrier(int b) {
  if (b == 0) {
    kArrive ? named_barrier_arrive<kBase, kCtaThreads>() : named_barrier_sync<kBase, kCtaThreads>();
  } else {
    kArrive ? named_barrier_arrive<kBase + 1, kCtaThreads>() : named_barrier_sync<kBase + 1, kCtaThreads>();
  }
}

// V'^T position of (dim, logical key k of a tile): key half k >> 5, and inside it the order of
// P8's A fragments (thread t's bytes 4t..4t+3 and 16+4t.. of a k32 step hold its accumulator
// columns 2t, 2t+1, 8+2t, 9+2t and 16 + the same), so logical k = 32ks + 16h + 4t + i holds key
// 32ks + 16h + 8(i >> 1) + 2t + (i & 1).
__device__ __forceinline__ int group_vt_offset(int dim, int ks, int h, int t) {
  return ks * kGroupVtHalf + (dim >> 3) * kGroupVtSbo + h * 128 + (dim & 7) * 16 + 4 * t;
}

// K' of a staged tile, as fp16 (the E4M3 view, exact).
// Lane (kq = lane & 7, tq = lane >> 3) of warp w decodes elements 32u..32u+31 (u = (tq + kq / 2)
// & 3) of keys 16w + kq and + 8: the 8 lanes of a quarter-warp read 16 bytes of 8 different key
// rows in distinct banks, and write 16 bytes of 8 different rows of one core matrix column.
__device__ __forceinline__ void decode_keys(const uint8_t* staged, const uint2* table, uint8_t* kt, int tid) {
  const int lane = tid & 31, warp = tid >> 5, kq = lane & 7, u = ((lane >> 3) + (kq >> 1)) & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = warp * 16 + 8 * half + kq;
    const uint4 x = *reinterpret_cast<const uint4*>(staged + key * 64 + 16 * u);
    const uint32_t words[4] = {x.x, x.y, x.z, x.w};
    const uint16_t sc = *reinterpret_cast<const uint16_t*>(staged + kScaleOffset + key * 8 + 2 * u);
    const uint2 tab[2] = {table[sc & 0xff], table[sc >> 8]};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t lo, hi;
      nvfp4_word_to_e4m3(words[s], tab[s >> 1], lo, hi);
      *reinterpret_cast<uint4*>(kt + wgmma_f16_offset(key, 32 * u + 8 * s)) =
          make_uint4(e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(lo >> 16), e4m3x2_to_f16x2(hi), e4m3x2_to_f16x2(hi >> 16));
    }
  }
}

// V'^T of a staged tile: two units of 4 keys x 8 dims per thread.
__device__ __forceinline__ void decode_values(const uint8_t* staged, const uint2* table, uint8_t* vt, int tid) {
  const uint8_t* v = staged + kHalfBytes;
#pragma unroll
  for (int unit = 0; unit < 2; ++unit) {
    const int u = tid + kThreads * unit, dg = u & 15, q = u >> 4;
    const int ks = q >> 3, h = (q >> 2) & 1, tq = q & 3;
    const int key0 = 32 * ks + 16 * h + 2 * tq;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = key0 + 8 * (i >> 1) + (i & 1);
      const uint32_t x = *reinterpret_cast<const uint32_t*>(v + key * (kDim / 2) + 4 * dg);
      const uint8_t sc = v[kScaleOffset + key * (kDim / 16) + (dg >> 1)];
      nvfp4_word_to_e4m3(x, table[sc], lo[i], hi[i]);
    }
    uint32_t cols[4];
    transpose4x4(lo, cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(vt + group_vt_offset(8 * dg + j, ks, h, tq)) = cols[j];
    transpose4x4(hi, cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(vt + group_vt_offset(8 * dg + 4 + j, ks, h, tq)) = cols[j];
  }
}

struct GroupSmem {
  const uint2* table;
  uint8_t* kt;      // kBuffers x kKtBytes
  uint8_t* vt;      // kBuffers x kGroupVtBytes
  uint8_t* stages;  // kGroupStages x kStageBytes
};

// The producer warpgroup: tile i's raw bytes (issued two tiles ahead) decoded into buffer
// i % kBuffers once the consumer is done with tile i - kBuffers there.
__device__ __forceinline__ void produce_tiles(const AttentionArgs& a, const SparseWork& w, const GroupUnionLists& ul,
                                              int num_tiles, const GroupSmem& sm) {
  const int tid = threadIdx.x - kThreads;
  const TileSource src = tile_source(a, w.kv_head);
  // The tiles' copy sources (tile_copy_source), made a chunk of kThreads tiles at a time, one tile a
  // thread, into a ring of two chunks: chunk c + 1 is made right after the last copy of chunk c is
  // issued, while other threads may still read chunk c's half; the next producer barrier publishes it
  // before its first copy.
  __shared__ TileCopySource s_sources[2 * kThreads];
  auto make_sources = [&](int chunk) {
    const int i = chunk * kThreads + tid;
    if (i < num_tiles) {
      const int e = ul.tiles[i];
      s_sources[i % (2 * kThreads)] = tile_copy_source(src, ul.phys[e >> 2], e & 3);
    }
  };
  auto issue = [&](int i) {
    issue_tile(i < num_tiles ? &s_sources[i % (2 * kThreads)] : nullptr, src.v_offset,
               sm.stages + (i % kGroupStages) * kStageBytes, tid);
  };
  make_sources(0);
  named_barrier_sync<kProducerBarrier, kThreads>();
  issue(0);  // with the table's copies
  issue(1);
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<1>();  // this thread's copies of tile i (tile i + 1 may still be in flight)
    // Every producer thread's copies of tile i landed, and every one is past its decode of tile
    // i - 1, whose stage the next copies take.
    named_barrier_sync<kProducerBarrier, kThreads>();
    issue(i + 2);
    if ((i + 3) % kThreads == 0) make_sources((i + 3) / kThreads);
    const int b = i % kBuffers;
    if (i >= kBuffers) buffer_barrier<kEmptyBarrier, false>(b);
    const uint8_t* staged = sm.stages + (i % kGroupStages) * kStageBytes;
    decode_keys(staged, sm.table, sm.kt + b * kKtBytes, tid);
    decode_values(staged, sm.table, sm.vt + b * kGroupVtBytes, tid);
    fence_async_shared();  // the stores before the consumer's wgmma reads them
    buffer_barrier<kFullBarrier, true>(b);
  }
  cp_async_wait<0>();
}

// The consumer warpgroup: the MMAs and the softmax of every tile, and the rows' results.
__device__ __forceinline__ void consume_tiles(const AttentionArgs& a, const SparseWork& w, const GroupUnionLists& ul,
                                              int num_tiles, const GroupSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int hkv = a.cache.num_kv_heads, group = a.num_q_heads / hkv;
  const int tiles_per_block = a.cache.block_size / kTileTokens;
  const int row0 = w.row, nrows = w.row_count, kv = w.kv_head;

  // Q' of this warp's row as the A fragments of the 8 k16 steps (rows past the group's and heads
  // past the GQA group are zero columns), loaded while tile 0 lands.
  uint32_t qf[kDim / 16][4];
  const int64_t q_row = (int64_t(row0 + warp) * a.num_q_heads + kv * group) * kDim;
  {
    // Pair k: k16 step k >> 2, register k & 3 (head g + 8 (r & 1), element 16 ks + 2t + 8 (r >> 1)).
    uint32_t pairs[kDim / 4];
    load_act2_e4m3_as_f16x2_batch(
        a.q, a.q_kind,
        [&](int k) { return q_row + (g + 8 * (k & 1)) * kDim + 16 * (k >> 2) + 2 * t + 8 * ((k >> 1) & 1); },
        [&](int k) { return warp < nrows && g + 8 * (k & 1) < group; }, pairs);
#pragma unroll
    for (int k = 0; k < kDim / 4; ++k) qf[k >> 2][k & 3] = pairs[k];
  }

  const float c2 = a.sm_scale * kLog2e;
  const int my_pos = warp < nrows ? a.step.positions[row0 + warp] : -1;
  // This thread's columns: heads g (h = 0) and g + 8 (h = 1) of row `warp`; its keys of a tile:
  // 8j + 2t + c. sd[4j + 2h + c] is (column h, key 8j + 2t + c); o[4j + 2h + c] (column h, dim
  // 8j + 2t + c).
  float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.0f, 0.0f};
  float o[64];
#pragma unroll
  for (int c = 0; c < 64; ++c) o[c] = 0.0f;
  uint32_t pa[2][4];

  for (int i = 0; i < num_tiles; ++i) {
    const int b = i % kBuffers;
    const uint8_t* kt = sm.kt + b * kKtBytes;
    const uint8_t* vt = sm.vt + b * kGroupVtBytes;
    buffer_barrier<kFullBarrier, false>(b);  // K' and V'^T of tile i decoded
    float sd[32];
#pragma unroll
    for (int c = 0; c < 32; ++c) sd[c] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
      wgmma_f16<64>(sd, qf[ks], wgmma_desc(kt + 2 * ks * kF16CoreK, kF16CoreK, kF16CoreN), ks > 0);
    wgmma_commit();
    wgmma_wait_all();
    wgmma_pin<64>(sd);

    const int e = ul.tiles[i];
    const int key_pos0 = (ul.block[e >> 2] * tiles_per_block + (e & 3)) * kTileTokens;
    const bool active = (ul.rows[e >> 2] >> warp & 1) && key_pos0 <= my_pos;  // the same for the warp
    if (active) {
      if (key_pos0 + kTileTokens - 1 > my_pos) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            if (key_pos0 + 8 * j + 2 * t + c > my_pos) sd[4 * j + c] = sd[4 * j + 2 + c] = -INFINITY;
      }
      float bias[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(sd[4 * j + 2 * h], sd[4 * j + 2 * h + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float m_new = fmaxf(m_run[h], m);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        if (m_new > m_run[h]) {  // alpha is exactly 1 otherwise
          const float alpha = ex2_approx((m_run[h] - m_use) * c2);
          l_part[h] *= alpha;
#pragma unroll
          for (int j = 0; j < 16; ++j) o[4 * j + 2 * h] *= alpha, o[4 * j + 2 * h + 1] *= alpha;
          m_run[h] = m_new;
        }
        bias[h] = fmaf(-m_use, c2, kLog2_448);
      }
      // P8 (the normaliser takes the unquantised values) into the A fragments of the two k32
      // steps: pa[ks][h] keys 32ks + {2t, 2t+1, 8+2t, 9+2t}, pa[ks][2 + h] the same + 16.
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float p[4];
#pragma unroll
            for (int jj = 0; jj < 2; ++jj)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int j = 4 * ks + 2 * hi + jj;
                p[2 * jj + c] = ex2_approx(fmaf(sd[4 * j + 2 * h + c], c2, bias[h]));
                l_part[h] += p[2 * jj + c];
              }
            pa[ks][2 * hi + h] = f32x2_to_e4m3x2(p[0], p[1]) | f32x2_to_e4m3x2(p[2], p[3]) << 16;
          }
    } else {
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[k][r] = 0u;
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
      wgmma_e4m3<128>(o, pa[ks], wgmma_desc(vt + ks * kGroupVtHalf, 128, kGroupVtSbo), true);
    wgmma_commit();
    wgmma_wait_all();
    wgmma_pin<128>(o);
    // This warp's MMAs are done with buffer b: the producer decodes tile i + kBuffers there once
    // all four warps have arrived (only if it will: the barrier's count must close).
    if (i + kBuffers < num_tiles) buffer_barrier<kEmptyBarrier, true>(b);
  }

  if (warp >= nrows) return;
  const int row = row0 + warp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_part[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int head = g + 8 * h;
    const float m = m_run[h];
    if (w.partial >= 0) {
      const int64_t p = (int64_t(w.partial) + int64_t(warp) * w.partial_stride) * kMaxGroup + head;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<float2*>(a.partial_o + p * kDim + 8 * j + 2 * t) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
      if (t == 0) store_partial_ml(a, p, m, l);
    } else if (head < group) {
      const int64_t out_head = int64_t(row) * a.num_q_heads + kv * group + head;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(a.out + out_head * kDim + 8 * j + 2 * t) =
            pack2<true>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
      if (a.lse && t == 0) a.lse[out_head] = q8kv4_lse(m, l, a.sm_scale);
    }
  }
}

__global__ void __launch_bounds__(kCtaThreads, 2) sparse_groups_kernel(const AttentionArgs a) {
  kernel_prologue();
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_num_tiles, s_shared;
  uint2* table = reinterpret_cast<uint2*>(smem);
  uint8_t* kt = smem + kTableBytes;
  uint8_t* vt = kt + kBuffers * kKtBytes;
  uint8_t* stages = vt + kBuffers * kGroupVtBytes;
  int* lists = reinterpret_cast<int*>(stages + kGroupStages * kStageBytes);
  const GroupUnionLists ul{lists, lists + kMaxGroupCandidates, lists + 2 * kMaxGroupCandidates,
                           lists + 3 * kMaxGroupCandidates};

  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  const SparseWork w = static_cast<const SparseWork*>(a.work)[blockIdx.x];
  const int32_t* pages = a.step.page_table + int64_t(a.step.token_seq[w.row]) * a.step.pages_per_seq;
  // The decode table (2 KB, 16 bytes a producer thread), requested now; the producer's first
  // commit covers these copies.
  if (threadIdx.x >= kThreads) {
    const int c = threadIdx.x - kThreads;
    cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  }
  // The union is always walked together (a share threshold of 0): rows that share few blocks
  // multiply masked columns, but the row walk (sparse_rows.cu, fp16 scores too since session 28)
  // does a quarter of the useful work per second (msa_bench: ~26 TFLOP/s at Q = 8, B = 64, 128K,
  // against ~110 on the prefill suite's 16K-row chunks, session 39).
  // No visible selected block at all: an empty walk (zero output, LSE -inf).
  const bool any = build_group_union<kCtaThreads, 0, 1>(a, w, pages, ul, &s_num_tiles, &s_shared);
  const int num_tiles = any ? s_num_tiles : 0;
  const GroupSmem sm{table, kt, vt, stages};
  if (threadIdx.x >= kThreads) {
    warpgroup_registers_dec<kProducerRegisters>();
    produce_tiles(a, w, ul, num_tiles, sm);
  } else {
    warpgroup_registers_inc<kConsumerRegisters>();
    consume_tiles(a, w, ul, num_tiles, sm);
  }
}

}  // namespace

cudaError_t init_sparse_groups_kernel() {
  return cudaFuncSetAttribute(sparse_groups_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
}

int sparse_groups_ctas_per_sm() { return ctas_per_sm(sparse_groups_kernel, kSmemBytes, kCtaThreads); }

cudaError_t launch_sparse_groups(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  if (a.cache.kv_dtype != KvDType::kNVFP4) return cudaErrorInvalidValue;
  launch_kernel(sparse_groups_kernel, a.num_work, kCtaThreads, kSmemBytes, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
