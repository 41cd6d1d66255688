// Sparse attention of one query row over its selected blocks, NVFP4 KV cache (Q8KV4), on wgmma:
// the decode path of MSA. One CTA (one warpgroup) per (query token, KV head, selection slot range);
// 4 CTAs fit on a multiprocessor (121 registers, 47 KB of shared memory). A row split over slot
// ranges is merged by its last CTA to finish (split_combine.cuh), not by a combine launch. Row
// groups (prefill) over NVFP4 take sparse_groups.cu, other KV dtypes attention.cu.
//
// The row walk, per 64-token tile:
//   S^T[64 keys][16 heads] = K' q'^T     wgmma m64n16k16 x 8 in fp16: K' (the E4M3 view of the
//                                        keys, exact in fp16) as register A fragments decoded
//                                        straight from the staged codes (warp w: keys
//                                        16w..16w+15), q' = E4M3(q) as B in shared memory, in the
//                                        permuted head-dim order of wgmma.cuh's f16_row_element.
//                                        fp16, not E4M3 MMAs: Hopper's FP8 sums are off by up to
//                                        ~1e-3 of the sum of |products|, and a row that sees few
//                                        keys then misses the reference's LSE and P8 roundings
//                                        (decode_q8kv4_short);
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
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sparse_nvfp4.cuh"
#include "kernels/cuda/split_combine.cuh"

namespace m3::cuda::detail {
namespace {

using namespace sparse_nvfp4;

constexpr int kStages = 3;
// V'^T: for each (key half ks, dim half h) a 64 x 32 A operand of 8 dim groups x 2 key chunks of
// core matrices, LBO 128 along keys, SBO 272 along dims, 2240 bytes apart. The odd strides put the
// 16 dim groups a warp's stage_vt stores at once (same key offset) in distinct banks; with 256
// and 2048 they all fell in one.
constexpr int kVtLbo = 128, kVtSbo = 272, kVtSub = 2240;
constexpr int kVtBytes = 4 * kVtSub;
// P8^T: for each key half ks a 16 x 32 B operand (2 head groups x 2 key chunks; LBO 128, SBO 256).
constexpr int kPtBytes = 2 * 512;
constexpr int kQBytes = 2 * kF16CoreN;  // 16 heads x 128 fp16
constexpr int kListInts = 2 * kMaxSlotsPerItem * kMaxTilesPerBlock;

__device__ __forceinline__ int vt_offset(int dim, int key) {
  return ((key >> 5) * 2 + (dim >> 6)) * kVtSub + ((dim >> 3) & 7) * kVtSbo + ((key >> 4) & 1) * kVtLbo +
         (dim & 7) * 16 + (key & 15);
}
__device__ __forceinline__ int pt_offset(int head, int key) {
  return (key >> 5) * 512 + (head >> 3) * 256 + ((key >> 4) & 1) * 128 + (head & 7) * 16 + (key & 15);
}

// The keys of a tile sit in P8^T and V'^T in slot order: in each chunk of 16, keys k and k + 8
// (k < 8) take slots 2k and 2k + 1, so that the thread holding both scores of a head stores them
// as one 16-bit word. PV sums over slots, so the order is free.
__device__ __forceinline__ int key_of_slot(int slot) {
  return (slot & ~15) | ((slot & 15) >> 1) | ((slot & 1) << 3);
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
      // Slot key0 + r of V'^T holds key_of_slot(key0 + r): key0 is a multiple of 4, so that is
      // key_of_slot(key0) + 0, 8, 1, 9.
      const int key = key_of_slot(key0) + (r & 1) * 8 + (r >> 1);
      const uint32_t x = *reinterpret_cast<const uint32_t*>(v + key * (kDim / 2) + 4 * dg);
      const uint8_t sc = v[kScaleOffset + key * (kDim / 16) + (dg >> 1)];
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
  __shared__ __align__(16) float s_max[16][4];
  __shared__ float s_sum[4][16];
  __shared__ int s_num_tiles;
  __shared__ const uint8_t* s_tile_codes[kListInts / 2];
  __shared__ const uint8_t* s_tile_scales[kListInts / 2];
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
  const TileSource src = tile_source(a, kv);
  const int tiles_per_block = a.cache.block_size / kTileTokens;

  // q' = E4M3(q) as fp16 in the keys' head-dim order (f16_row_element); heads past the group zero.
  // A thread's pairs are loaded together, before warp 0's listing, so that their latency and the
  // listing's chain of loads overlap (one after the other, they held ncu's samples of the walk's
  // start).
  constexpr int kQPairs = 16 * (kDim / 2) / kThreads;
  const int p2 = (tid % (kDim / 2)) * 2, h0 = tid / (kDim / 2);
  const int64_t q0 = (int64_t(row) * a.num_q_heads + kv * group) * kDim + f16_row_element(p2);
  uint32_t qv[kQPairs];
  load_act2_e4m3_as_f16x2_batch(
      a.q, a.q_kind, [&](int k) { return q0 + (h0 + k * (kThreads / (kDim / 2))) * kDim; },
      [&](int k) { return h0 + k * (kThreads / (kDim / 2)) < group; }, qv);

  if (warp == 0) {
    const int n = list_row_tiles(a, row, kv, slot_begin, slot_end, pages, tile_list, tile_phys);
    if (lane == 0) s_num_tiles = n;
    __syncwarp();
    // Each tile's copy sources, made once (V's are src.v_offset further): in the loop, the
    // addresses from the block and the tile's place in it took ~75 instructions a tile. These are
    // tile_copy_source's; the walk on tile_copy_source and issue_tile (session 51) measured 0.2-0.3 us
    // slower at batch 1 (H100, msa_bench --case 1,1,131072), so it keeps its two arrays.
    for (int i = lane; i < n; i += 32) {
      const int tok0 = (tile_list[i] % tiles_per_block) * kTileTokens;
      const uint8_t* slot = src.k_head + tile_phys[i] * src.block_bytes;
      s_tile_codes[i] = slot + tok0 * (kDim / 2);
      s_tile_scales[i] = slot + src.block_size * (kDim / 2) + tok0 * (kDim / 16);
    }
  }
#pragma unroll
  for (int k = 0; k < kQPairs; ++k)
    *reinterpret_cast<uint32_t*>(q_tile + wgmma_f16_offset(h0 + k * (kThreads / (kDim / 2)), p2)) = qv[k];
  fence_async_shared();
  __syncthreads();
  const int num_tiles = s_num_tiles;

  auto issue = [&](int i) {
    if (i < num_tiles) {
      uint8_t* const dst = stages + (i % kStages) * kStageBytes;
      const uint8_t* const codes = s_tile_codes[i];
      const uint8_t* const scales = s_tile_scales[i];
      stage_tile<KvDType::kNVFP4, kThreads>(dst, codes, scales, tid);
      stage_tile<KvDType::kNVFP4, kThreads>(dst + kHalfBytes, codes + src.v_offset, scales + src.v_offset, tid);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  uint64_t qdesc[kDim / 16];
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) qdesc[ks] = wgmma_desc(q_tile + 2 * ks * kF16CoreK, kF16CoreK, kF16CoreN);
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

    uint32_t kb[2][kDim / 16][2];
    nvfp4_key_row_f16(kt, table, warp * 16 + g, t, kb[0]);
    nvfp4_key_row_f16(kt, table, warp * 16 + 8 + g, t, kb[1]);
    float sd[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) sd[c] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      const uint32_t af[4] = {kb[0][ks][0], kb[1][ks][0], kb[0][ks][1], kb[1][ks][1]};
      wgmma_f16<16>(sd, af, qdesc[ks], ks > 0);
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
    // Tile maximum per head over the 64 keys: this thread's 2, the warp's 16 (a butterfly that halves
    // the heads a lane carries at each step: lane g keeps head column hc = g >> 1 of its four), the
    // 4 warps (s_max[head][warp], one 16-byte load a head).
    float mx[4];
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) mx[hc] = fmaxf(sd[4 * (hc >> 1) + (hc & 1)], sd[4 * (hc >> 1) + 2 + (hc & 1)]);
    {
      const bool hi4 = g & 4, hi2 = g & 2;
      const float send0 = hi4 ? mx[0] : mx[2], send1 = hi4 ? mx[1] : mx[3];
      const float r0 = fmaxf(hi4 ? mx[2] : mx[0], __shfl_xor_sync(0xffffffffu, send0, 16));
      const float r1 = fmaxf(hi4 ? mx[3] : mx[1], __shfl_xor_sync(0xffffffffu, send1, 16));
      float m = fmaxf(hi2 ? r1 : r0, __shfl_xor_sync(0xffffffffu, hi2 ? r0 : r1, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      // Lane g now holds head column hc = 2 (g >> 2) + ((g >> 1) & 1): head 8 (hc >> 1) + 2t + (hc & 1).
      if ((g & 1) == 0) s_max[8 * (g >> 2) + 2 * t + ((g >> 1) & 1)][warp] = m;
    }
    __syncthreads();
    float bias[4];
#pragma unroll
    for (int hc = 0; hc < 4; ++hc) {
      const int head = 8 * (hc >> 1) + 2 * t + (hc & 1);
      const float4 wm = *reinterpret_cast<const float4*>(s_max[head]);
      const float m_tile = fmaxf(fmaxf(wm.x, wm.y), fmaxf(wm.z, wm.w));
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
      // Keys 16w + g and + 8: slots 16w + 2g and + 1 (key_of_slot).
      *reinterpret_cast<uint16_t*>(pt + pt_offset(head, warp * 16 + 2 * g)) = uint16_t(f32x2_to_e4m3x2(p0, p1));
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

constexpr int kSmemBytes = kQBytes + kTableBytes + kVtBytes + kPtBytes + kStages * kStageBytes + kListInts * 4;

__global__ void __launch_bounds__(kThreads) sparse_rows_kernel(const AttentionArgs a) {
  kernel_prologue();
  extern __shared__ __align__(128) uint8_t smem[];
  uint2* table = reinterpret_cast<uint2*>(smem + kQBytes);
  uint8_t* vt = smem + kQBytes + kTableBytes;
  uint8_t* pt = vt + kVtBytes;
  uint8_t* stages = pt + kPtBytes;
  int* lists = reinterpret_cast<int*>(stages + kStages * kStageBytes);

  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  const SparseWork w = static_cast<const SparseWork*>(a.work)[blockIdx.x];
  for (int c = threadIdx.x; c < 128; c += kThreads) cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  row_walk(a, RowWalkSmem{smem, table, vt, pt, stages, lists}, w.row, w.kv_head, w.begin, w.end, w.partial);
  if (w.combine < 0) return;
  // The row's splits: the last CTA to arrive merges them (no combine launch after this kernel).
  // The CTA barrier orders every thread's partial stores before thread 0's arrival, whose
  // acquire-release atomic makes them visible device-wide (release) and the other CTAs' partials
  // visible here (acquire; read through L2), the pattern of a grid barrier's arrival. A fence in
  // every thread (__threadfence) cost each warp a full memory barrier.
  __shared__ bool last;
  __syncthreads();
  const CombineWork cw = a.combine_work[w.combine];
  if (threadIdx.x == 0) last = atomic_add_acq_rel_gpu(a.combine_done + w.combine, 1) == cw.num_splits - 1;
  __syncthreads();
  if (!last) return;
  CombineArgs c;
  c.num_q_heads = a.num_q_heads;
  c.num_kv_heads = a.cache.num_kv_heads;
  c.sm_scale = a.sm_scale;
  c.nvfp4 = true;
  c.partial_o = a.partial_o;
  c.partial_ml = a.partial_ml;
  c.out = a.out;
  c.lse = a.lse;
  combine_splits<true>(c, cw);
  if (threadIdx.x == 0) a.combine_done[w.combine] = 0;  // zero again for the next launch (graph replays)
}

}  // namespace

cudaError_t init_sparse_rows_kernel() {
  return cudaFuncSetAttribute(sparse_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
}

int sparse_rows_ctas_per_sm() { return ctas_per_sm(sparse_rows_kernel, kSmemBytes); }

cudaError_t launch_sparse_rows(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  if (a.cache.kv_dtype != KvDType::kNVFP4) return cudaErrorInvalidValue;
  launch_kernel(sparse_rows_kernel, a.num_work, kThreads, kSmemBytes, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
