// What the two sparse attention kernels over an NVFP4 KV cache (Q8KV4) share: the staged tile
// and its layout, V's decode into a transposed E4M3 operand, and the walk of one query row over
// its selected tiles (sparse_rows.cu runs it for rows alone, sparse_groups.cu for the rows of a
// group that share few blocks).
//
// The row walk: one warpgroup, per 64-token tile
//   S^T[64 keys][16 heads] = K' q'^T     wgmma m64n16k32 x 4: K' (the E4M3 view of the keys) as
//                                        register A fragments decoded straight from the staged
//                                        codes (warp w: keys 16w..16w+15), q' = E4M3(q) as B in
//                                        shared memory, in the permuted head-dim order of
//                                        wgmma.cuh's key rows;
//   tile maximum per head over the 4 warps, the running maximum, P8 = E4M3(448 exp(s - m));
//   O^T[128 dims][16 heads] += V'^T P8^T wgmma m64n16k32 x 4 (two dim halves x two key halves),
//                                        V' decoded and transposed into shared memory (4 keys x
//                                        8 dims per thread, byte permutes), P8 written there too.
// The V' decode runs while the tensor cores compute S. The accumulators are split over the
// warpgroup (16 floats a thread for O), so no per-warp states need merging at the end.
//
// Numerics (ops/attention.h Q8KV4): the running maximum is that of the tiles seen so far, over all
// 64 keys of a tile; the normaliser sums the unquantised 448 exp(.); products are exact and
// accumulate in fp32.
#pragma once
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace m3::cuda::detail::sparse_nvfp4 {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kStages = 3;

// A staged tile: K codes (64 rows of 64 bytes), K scales (64 x 8), then V the same.
constexpr int kHalfBytes = kTileTokens * (kDim / 2 + kDim / 16);
constexpr int kScaleOffset = kTileTokens * kDim / 2;
constexpr int kStageBytes = 2 * kHalfBytes;
// V'^T: for each (key half ks, dim half h) a 64 x 32 A operand of 8 dim groups x 2 key chunks of
// core matrices, LBO 128 along keys, SBO 272 along dims, 2240 bytes apart. The odd strides put the
// 16 dim groups a warp's stage_vt stores at once (same key offset) in distinct banks; with 256
// and 2048 they all fell in one.
constexpr int kVtLbo = 128, kVtSbo = 272, kVtSub = 2240;
constexpr int kVtBytes = 4 * kVtSub;
// P8^T: for each key half ks a 16 x 32 B operand (2 head groups x 2 key chunks; LBO 128, SBO 256).
constexpr int kPtBytes = 2 * 512;
constexpr int kQBytes = 2 * kQCoreN;  // 16 heads x 128 bytes
constexpr int kListInts = 2 * kMaxSlotsPerItem * kMaxTilesPerBlock;
constexpr int kTableBytes = 256 * 8;

__device__ __forceinline__ int vt_offset(int dim, int key) {
  return ((key >> 5) * 2 + (dim >> 6)) * kVtSub + ((dim >> 3) & 7) * kVtSbo + ((key >> 4) & 1) * kVtLbo +
         (dim & 7) * 16 + (key & 15);
}
__device__ __forceinline__ int pt_offset(int head, int key) {
  return (key >> 5) * 512 + (head >> 3) * 256 + ((key >> 4) & 1) * 128 + (head & 7) * 16 + (key & 15);
}

// Four rows of 4 bytes to four columns: out[j] byte r = in[r] byte j.
__device__ __forceinline__ void transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(in[0], in[1], 0x5140), t1 = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t t2 = __byte_perm(in[0], in[1], 0x7362), t3 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(t0, t1, 0x5410), out[1] = __byte_perm(t0, t1, 0x7632);
  out[2] = __byte_perm(t2, t3, 0x5410), out[3] = __byte_perm(t2, t3, 0x7632);
}

// V' of the staged tile to V'^T: thread tid takes keys 4(tid/16) .. +3 (and 32 further) x dims
// 8(tid%16) .. +7.
__device__ __forceinline__ void stage_vt(const uint8_t* v, const uint2* table, uint8_t* vt, int tid) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key0 = 4 * (tid >> 4) + 32 * half, dg = tid & 15;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t x = *reinterpret_cast<const uint32_t*>(v + (key0 + r) * (kDim / 2) + 4 * dg);
      const uint8_t sc = v[kScaleOffset + (key0 + r) * (kDim / 16) + (dg >> 1)];
      nvfp4_word_to_e4m3(x, table[sc], lo[r], hi[r]);
    }
    uint32_t cols[4];
    transpose4x4(lo, cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(vt + vt_offset(8 * dg + j, key0)) = cols[j];
    transpose4x4(hi, cols);
#pragma unroll
    for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(vt + vt_offset(8 * dg + 4 + j, key0)) = cols[j];
  }
}

// Issues the async copies of a walk's tile (K then V of logical tile `tile`, physical block
// `phys`) into the stage at `dst` when `valid`, then commits (also when not, so that the wait
// counts hold past the walk's end).
__device__ __forceinline__ void issue_tile(const AttentionArgs& a, int kv, uint8_t* dst, bool valid, int tile,
                                           int phys) {
  if (valid) {
    const int bs = a.cache.block_size, tiles_per_block = bs / kTileTokens;
    const uint8_t* k = a.cache.kv_slot(phys, 0, kv);
    const int64_t v_offset = a.cache.kv_slot(0, 1, kv) - a.cache.kv_slot(0, 0, kv);
    const int tok0 = (tile % tiles_per_block) * kTileTokens;
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const uint8_t* slot = k + which * v_offset;
      stage_tile<KvDType::kNVFP4, kThreads>(dst + which * kHalfBytes, slot + tok0 * (kDim / 2),
                                            slot + bs * (kDim / 2) + tok0 * (kDim / 16), threadIdx.x);
    }
  }
  cp_async_commit();
}

// A walk's result for one (row, head) once its numerator is written: the partial's running
// maximum and normaliser, or the row's LSE (natural log; the normaliser carries P8's 448).
__device__ __forceinline__ void store_partial_ml(const AttentionArgs& a, int64_t p, float m, float l) {
  a.partial_ml[p * 2] = m;
  a.partial_ml[p * 2 + 1] = l;
}
__device__ __forceinline__ float q8kv4_lse(float m, float l, float sm_scale) {
  return l > 0.0f ? m * sm_scale + logf(l) - kLn448 : -INFINITY;
}

// The shared memory a row walk uses (sizes above): the E4M3 table must have been requested by
// cp.async (the walk's first commit covers it) or be in place.
struct RowWalkSmem {
  uint8_t* q_tile;  // kQBytes
  const uint2* table;
  uint8_t* vt;      // kVtBytes
  uint8_t* pt;      // kPtBytes
  uint8_t* stages;  // kStages * kStageBytes
  int* lists;       // kListInts
};

// Query row `row`, KV head `kv`, selection slots [slot_begin, slot_end); partial < 0: the final
// bf16 output (and LSE), else the unnormalised partial `partial`. Every thread of the CTA calls it.
__device__ __forceinline__ void row_walk(const AttentionArgs& a, const RowWalkSmem& sm, int row, int kv,
                                         int slot_begin, int slot_end, int partial) {
  __shared__ float s_max[4][16], s_sum[4][16];
  __shared__ int s_num_tiles;
  uint8_t* const q_tile = sm.q_tile;
  const uint2* const table = sm.table;
  uint8_t* const vt = sm.vt;
  uint8_t* const pt = sm.pt;
  uint8_t* const stages = sm.stages;
  int* const tile_list = sm.lists;
  int* const tile_phys = sm.lists + kListInts / 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int hkv = a.cache.num_kv_heads, group = a.num_q_heads / hkv;
  const int pos = a.step.positions[row];
  const int32_t* pages = a.step.page_table + int64_t(a.step.token_seq[row]) * a.step.pages_per_seq;
  if (warp == 0) {
    const int n = list_row_tiles(a, row, kv, slot_begin, slot_end, pages, tile_list, tile_phys);
    if (lane == 0) s_num_tiles = n;
  }
  // q' = E4M3(q) in the keys' head-dim order; heads past the group zero.
  for (int idx = tid; idx < 16 * (kDim / 4); idx += kThreads) {
    const int h = idx / (kDim / 4), p4 = (idx % (kDim / 4)) * 4;
    uint32_t v = 0;
    if (h < group)
      v = load_act4_e4m3(a.q, a.q_kind, (int64_t(row) * a.num_q_heads + kv * group + h) * kDim + e4m3_row_element(p4));
    *reinterpret_cast<uint32_t*>(q_tile + wgmma_q_offset(h, p4)) = v;
  }
  fence_async_shared();
  __syncthreads();
  const int num_tiles = s_num_tiles;

  auto issue = [&](int i) {
    issue_tile(a, kv, stages + (i % kStages) * kStageBytes, i < num_tiles, i < num_tiles ? tile_list[i] : 0,
               i < num_tiles ? tile_phys[i] : 0);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  uint64_t qdesc[kDim / 32];
#pragma unroll
  for (int s = 0; s < kDim / 32; ++s) qdesc[s] = wgmma_desc(q_tile + 2 * s * kQCoreK, kQCoreK, kQCoreN);
  const float c2 = a.sm_scale * kLog2e;
  // This thread's heads (columns): 2t, 2t + 1, 8 + 2t, 9 + 2t; its keys of a tile: 16w + g, +8.
  float m_run[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l_part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float o[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int c = 0; c < 8; ++c) o[h][c] = 0.0f;

  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i landed; the last tile's MMAs are done with V'^T and P8^T
    issue(i + kStages - 1);
    const uint8_t* kt = stages + (i % kStages) * kStageBytes;
    const int key_pos0 = tile_list[i] * kTileTokens;

    uint32_t kb[2][kDim / 32][2];
    nvfp4_key_row(kt, table, warp * 16 + g, t, kb[0]);
    nvfp4_key_row(kt, table, warp * 16 + 8 + g, t, kb[1]);
    float sd[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) sd[c] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kDim / 32; ++s) {
      const uint32_t af[4] = {kb[0][s][0], kb[1][s][0], kb[0][s][1], kb[1][s][1]};
      wgmma_e4m3<16>(sd, af, qdesc[s], s > 0);
    }
    wgmma_commit();
    stage_vt(kt + kHalfBytes, table, vt, tid);  // on the ALUs while the tensor cores compute S
    wgmma_wait_all();
    wgmma_pin<16>(sd);

    // sd[4j + c]: key 16w + g (c < 2) or + 8, head 8j + 2t + (c & 1). Mask keys past the row.
    const int key_g = key_pos0 + warp * 16 + g;
    if (key_pos0 + kTileTokens - 1 > pos) {
#pragma unroll
      for (int c = 0; c < 8; ++c)
        if (key_g + ((c >> 1) & 1) * 8 > pos) sd[c] = -INFINITY;
    }
    // Tile maximum per head over the 64 keys: this thread's 2, the warp's 16, the 4 warps.
    float mx[4];
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) {
      const int j = hc >> 1, c = hc & 1;
      float m = fmaxf(sd[4 * j + c], sd[4 * j + 2 + c]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      mx[hc] = m;
    }
    if (g == 0) {
#pragma unroll
      for (int hc = 0; hc < 4; ++hc) s_max[warp][8 * (hc >> 1) + 2 * t + (hc & 1)] = mx[hc];
    }
    __syncthreads();
    float bias[4];
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) {
      const int head = 8 * (hc >> 1) + 2 * t + (hc & 1);
      const float m_tile = fmaxf(fmaxf(s_max[0][head], s_max[1][head]), fmaxf(s_max[2][head], s_max[3][head]));
      const float m_new = fmaxf(m_run[hc], m_tile);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      if (m_new > m_run[hc]) {  // alpha is exactly 1 otherwise
        const float alpha = ex2_approx((m_run[hc] - m_use) * c2);
        l_part[hc] *= alpha;
#pragma unroll
        for (int h = 0; h < 2; ++h) o[h][4 * (hc >> 1) + (hc & 1)] *= alpha, o[h][4 * (hc >> 1) + 2 + (hc & 1)] *= alpha;
        m_run[hc] = m_new;
      }
      bias[hc] = fmaf(-m_use, c2, kLog2_448);
    }
    // P8 = E4M3(448 exp(s - m)) to P8^T; the normaliser takes the unquantised values.
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) {
      const int j = hc >> 1, c = hc & 1, head = 8 * j + 2 * t + c;
      const float p0 = ex2_approx(fmaf(sd[4 * j + c], c2, bias[hc]));
      const float p1 = ex2_approx(fmaf(sd[4 * j + 2 + c], c2, bias[hc]));
      l_part[hc] += p0 + p1;
      const uint32_t e = f32x2_to_e4m3x2(p0, p1);
      pt[pt_offset(head, warp * 16 + g)] = uint8_t(e);
      pt[pt_offset(head, warp * 16 + 8 + g)] = uint8_t(e >> 8);
    }
    fence_async_shared();
    __syncthreads();  // V'^T and P8^T written
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
        wgmma_e4m3_ss<16>(o[h], wgmma_desc(vt + (ks * 2 + h) * kVtSub, kVtLbo, kVtSbo),
                        wgmma_desc(pt + ks * 512, 128, 256), true);
    wgmma_commit();
    wgmma_wait_all();
#pragma unroll
    for (int h = 0; h < 2; ++h) wgmma_pin<16>(o[h]);
  }
  cp_async_wait<0>();

  // The normaliser per head: this thread's keys, the warp's, the 4 warps'.
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
    float l = l_part[hc];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    if (g == 0) s_sum[warp][8 * (hc >> 1) + 2 * t + (hc & 1)] = l;
  }
  __syncthreads();
  // o[h][4j + c]: dim 64h + 16w + g (+8 for c >= 2), head 8j + 2t + (c & 1).
#pragma unroll
  for (int hc = 0; hc < 4; ++hc) {
    const int j = hc >> 1, c = hc & 1, head = 8 * j + 2 * t + c;
    const float l = s_sum[0][head] + s_sum[1][head] + s_sum[2][head] + s_sum[3][head];
    const float m = m_run[hc];
    if (partial >= 0) {
      const int64_t p = int64_t(partial) * kMaxGroup + head;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) a.partial_o[p * kDim + 64 * h + 16 * warp + g + 8 * r] = o[h][4 * j + 2 * r + c];
      if (warp == 0 && g == 0) store_partial_ml(a, p, m, l);
    } else if (head < group) {
      const int64_t out_head = int64_t(row) * a.num_q_heads + kv * group + head;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          a.out[out_head * kDim + 64 * h + 16 * warp + g + 8 * r] = bf16_encode(o[h][4 * j + 2 * r + c] * inv);
      if (a.lse && warp == 0 && g == 0) a.lse[out_head] = q8kv4_lse(m, l, a.sm_scale);
    }
  }
}

}  // namespace m3::cuda::detail::sparse_nvfp4
