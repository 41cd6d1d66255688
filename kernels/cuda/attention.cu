// Paged attention over the MSA-selected blocks (sparse) or over all visible blocks (dense), for
// decode and prefill rows alike, on tensor cores (mma.sync m16n8k16, fp32 accumulation).
//
// The M dimension of every MMA is the GQA group: the <= 16 query heads that share one KV head, so
// each K/V byte a CTA stages serves all of them.
//   sparse, one row: one CTA per (query token, KV head, slot range); the 4 warps split each
//           64-token tile (16 tokens each) and merge their online-softmax states at the end.
//           (Rows alone over an NVFP4 cache run sparse_rows.cu's wgmma kernel instead; this walk
//           serves bf16 and fp8 caches, the fallback of groups and the timing probe.)
//   sparse, a group (2-4 rows of one sequence: prefill): one CTA per (group, KV head, part of
//           the union of the rows' selected blocks, sparse_union.cuh); warp w owns row w and
//           walks the tiles its row selected, so a block several rows selected is read once.
//           (Groups over an NVFP4 cache run sparse_groups.cu's wgmma kernel instead, but under
//           the timing probe.)
//   dense:  one CTA per (<= 4 rows of one sequence, KV head, block range); warp w owns row w and
//           walks every tile, so a tile is staged once for 4 rows.
// Splits write unnormalised partials (O, running max, normaliser) that combine_kernel merges
// (split_combine.cuh); rows alone over an NVFP4 cache merge theirs in sparse_rows.cu's last CTA.
//
// Numerics (ops/attention.h): bf16/fp8 KV: bf16 MMAs, fp32 softmax, P rounded to bf16 for the PV
// MMA. nvfp4 KV: q' = E4M3(q), K'/V' the E4M3 view, P8 = E4M3(448 exp(.)) with the running max
// of the tile sequence, normaliser sum of the unquantised 448 exp(.) (docs/reference.md 3.2).
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/split_combine.cuh"
#include "kernels/cuda/sparse_union.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;

template <KvDType kFmt, bool kDense>
struct AttnConfig {
  static constexpr bool kNvfp4 = kFmt == KvDType::kNVFP4;
  static constexpr bool kBf16 = !kNvfp4;
  static constexpr int kRows = 4;  // query tokens per CTA (dense, sparse groups)
  static constexpr int kStages = kFmt == KvDType::kBF16 ? 2 : 3;
  static constexpr int kStageBytes = 2 * staged_tile_bytes(kFmt);  // K then V
  static constexpr int kExpandBytes = kFmt == KvDType::kBF16 ? 0 : 2 * kTileBytes;
  static constexpr int kTableBytes = kNvfp4 ? 256 * 8 : 0;
  static constexpr int kQBytes = kRows * 16 * kTileStride * 2;
  // The query tile is read into registers before the first tile is expanded, so it lives in the
  // expansion area where there is one (fp8, nvfp4).
  static constexpr bool kQApart = kExpandBytes < kQBytes;
  // dense: physical block per block. sparse: one row: (logical tile, physical block) per tile; a
  // group: the candidates (later the union's block ids), the union's physical blocks and row
  // masks, and the part's tiles (union index << 2 | tile in block).
  static constexpr int kSparseTiles = kMaxGroupCandidates * kMaxTilesPerBlock;
  static constexpr int kListBytes = kDense ? kDenseMaxBlocks * 4 : (3 * kMaxGroupCandidates + kSparseTiles) * 4;
  // Merge scratch ([4 warps][16][D] O + [4][16][2] m,l floats) reuses the tile area.
  static constexpr int kScratchBytes = 4 * 16 * kDim * 4 + 4 * 16 * 2 * 4;
  static constexpr int kTileArea = kStages * kStageBytes + kExpandBytes;
  static constexpr int kSmemBytes = (kQApart ? kQBytes : 0) + kListBytes + kTableBytes +
                                    (kTileArea > kScratchBytes ? kTileArea : kScratchBytes);
};

// One warp's pass over `NT` n-tiles (8 tokens each) of the K/V tiles, rows = its 16 heads.
// s_max (sparse only): the 4 warps of a row exchange their tile maxima through it, so all of them
// quantise P8 against the same running max (that of the tiles seen so far, as a kernel walking
// the keys in one sequence would); it costs one barrier per tile.
template <bool kNvfp4, int NT>
__device__ __forceinline__ void attend_chunk(const uint8_t* kt, const uint8_t* vt, int tok_off,
                                             int key_pos0, int my_pos, float c2,
                                             const uint32_t (&qf)[kDim / 16][4], float (&m_run)[2],
                                             float (&l_run)[2], float (&o)[kDim / 8][4], float* s_max) {
  constexpr bool kBf16 = !kNvfp4;
  const int lane = threadIdx.x & 31, t = lane & 3;
  float s[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s[nt][c] = 0.0f;
  const uint8_t* k_base =
      kt + (tok_off + (lane & 7) + ((lane >> 4) << 3)) * (kTileStride * 2) + ((lane >> 3) & 1) * 16;
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_base + np * 16 * (kTileStride * 2) + ks * 32);
      mma_16816<kBf16>(s[2 * np], qf[ks], kb[0], kb[1]);
      mma_16816<kBf16>(s[2 * np + 1], qf[ks], kb[2], kb[3]);
    }
  }
  // Causal mask (only the local block can reach past the row's position).
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (key_pos0 + tok_off + nt * 8 + 2 * t + (c & 1) > my_pos) s[nt][c] = -INFINITY;
      mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) mx[h] = warp_max_quad(mx[h]);
  if (s_max != nullptr) {
    const int warp = threadIdx.x >> 5, g = lane >> 2;
    if (t == 0) {
      s_max[warp * 16 + g] = mx[0];
      s_max[warp * 16 + g + 8] = mx[1];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h)
      mx[h] = fmaxf(fmaxf(s_max[g + 8 * h], s_max[16 + g + 8 * h]),
                    fmaxf(s_max[32 + g + 8 * h], s_max[48 + g + 8 * h]));
  }
  // The running state is rescaled only when some row's maximum grew: otherwise alpha is exactly 1
  // and the 64 multiplies would change nothing.
  float bias[2];
  const bool grew = mx[0] > m_run[0] || mx[1] > m_run[1];
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_run[h], mx[h]);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = ex2_approx((m_run[h] - m_use) * c2);
      m_run[h] = m_new;
      l_run[h] *= alpha;
#pragma unroll
      for (int nt = 0; nt < kDim / 8; ++nt) {
        o[nt][2 * h] *= alpha;
        o[nt][2 * h + 1] *= alpha;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_use = m_run[h] == -INFINITY ? 0.0f : m_run[h];
    bias[h] = kNvfp4 ? fmaf(-m_use, c2, kLog2_448) : -m_use * c2;
  }
  uint32_t pa[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = ex2_approx(fmaf(s[nt][2 * h], c2, bias[h]));
      const float p1 = ex2_approx(fmaf(s[nt][2 * h + 1], c2, bias[h]));
      l_run[h] += p0 + p1;
      pa[nt][h] = kNvfp4 ? f32x2_to_e4m3_as_f16x2(p0, p1) : pack2<true>(p0, p1);
    }
  const uint8_t* v_base =
      vt + (tok_off + (lane & 7) + ((lane >> 3) & 1) * 8) * (kTileStride * 2) + (lane >> 4) * 16;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const uint32_t a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
#pragma unroll
    for (int dp = 0; dp < kDim / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_base + kk * 16 * (kTileStride * 2) + dp * 32);
      mma_16816<kBf16>(o[2 * dp], a, vb[0], vb[1]);
      mma_16816<kBf16>(o[2 * dp + 1], a, vb[2], vb[3]);
    }
  }
}

// kProbe (timing only, sparse nvfp4, wrong outputs): the tiles of one-row walks are not expanded.
template <KvDType kFmt, bool kDense, bool kProbe = false>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttentionArgs a) {
  kernel_prologue();
  using C = AttnConfig<kFmt, kDense>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_num_tiles, s_shared_walk;
  __shared__ float s_max[4 * 16];
  uint8_t* lists = smem + (C::kQApart ? C::kQBytes : 0);
  int* block_phys = reinterpret_cast<int*>(lists);  // dense
  int* cand = reinterpret_cast<int*>(lists);         // sparse group: keys, then the union's block ids
  int* union_phys = cand + kMaxGroupCandidates;
  int* union_mask = union_phys + kMaxGroupCandidates;
  int* part_tiles = union_mask + kMaxGroupCandidates;
  int* tile_list = part_tiles;  // sparse, one row: logical tiles, then their physical blocks
  int* tile_phys = part_tiles + C::kSparseTiles / 2;
  uint2* table = reinterpret_cast<uint2*>(lists + C::kListBytes);
  uint8_t* area = lists + C::kListBytes + C::kTableBytes;
  uint8_t* stages = area;
  uint8_t* expanded = area + C::kStages * C::kStageBytes;
  uint8_t* q_tile = C::kQApart ? smem : expanded;

  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int hkv = a.cache.num_kv_heads;
  const int group = a.num_q_heads / hkv;
  const int bs = a.cache.block_size;
  const int tiles_per_block = bs / kTileTokens;

  // The work: rows [row0, row0 + nrows) and how they walk. Dense: one walk over a block range,
  // warp w owns row w. Sparse, one row: one walk over its slots, the warps split each tile.
  // Sparse group: one walk over a part of the rows' union (warp w owns row w) when the rows share
  // blocks; when they share few (a quarter of the candidates or less: the union walk would leave
  // most warps idle), one walk per row over the same part of its slots instead.
  int row0, nrows, kv, partial, tile_base = 0, partial_stride = 1, walks = 1;
  int slot_begin = 0, slot_end = 0;
  bool shared_walk = kDense;
  const int32_t* pages = nullptr;
  if constexpr (kDense) {
    const DenseWork w = static_cast<const DenseWork*>(a.work)[blockIdx.x];
    row0 = w.row_begin, nrows = w.row_count, kv = w.kv_head, partial = w.partial;
    partial_stride = w.partial_stride;
    tile_base = w.block_begin * tiles_per_block;
    const int last_pos = a.step.positions[row0 + nrows - 1];
    int n = min(w.block_end * tiles_per_block, last_pos / kTileTokens + 1) - tile_base;
    if (tid == 0) s_num_tiles = n < 0 ? 0 : n;
    pages = a.step.page_table + int64_t(w.seq) * a.step.pages_per_seq;
    for (int c = tid; c < w.block_end - w.block_begin; c += kThreads) block_phys[c] = pages[w.block_begin + c];
  } else {
    const SparseWork w = static_cast<const SparseWork*>(a.work)[blockIdx.x];
    row0 = w.row, nrows = w.row_count, kv = w.kv_head, partial = w.partial, partial_stride = w.partial_stride;
    pages = a.step.page_table + int64_t(a.step.token_seq[row0]) * a.step.pages_per_seq;
    if (nrows == 1) {
      slot_begin = w.begin, slot_end = w.end;
    } else {
      slot_begin = int(int64_t(a.topk) * w.begin / w.end), slot_end = int(int64_t(a.topk) * (w.begin + 1) / w.end);
      // Together only when the rows share more than a quarter of their blocks: otherwise the union
      // walk would leave most warps idle.
      build_group_union<kThreads, 4, 3>(a, w, pages, GroupUnionLists{cand, union_phys, union_mask, part_tiles},
                                        &s_num_tiles, &s_shared_walk);
      shared_walk = s_shared_walk;
      if (!shared_walk) walks = nrows;
    }
  }
  if (!kDense && !shared_walk && warp == 0) {
    const int n = list_row_tiles(a, row0, kv, slot_begin, slot_end, pages, tile_list, tile_phys);
    if (lane == 0) s_num_tiles = n;
  }
  if constexpr (C::kNvfp4) {
    for (int c = tid; c < 128; c += kThreads) cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  }
  __syncthreads();

  for (int walk = 0; walk < walks; ++walk) {
    // One walk: rows [wrow, wrow + wrows), the shared walk's or one row's.
    const int wrow = shared_walk ? row0 : row0 + walk, wrows = shared_walk ? nrows : 1;
    const int wpartial = shared_walk || partial < 0 ? partial : partial + walk * partial_stride;
    if (walk > 0) {  // the previous walk is done with the lists and the tile area
      if (warp == 0) {
        const int n = list_row_tiles(a, wrow, kv, slot_begin, slot_end, pages, tile_list, tile_phys);
        if (lane == 0) s_num_tiles = n;
      }
      __syncthreads();
    }
    const int num_tiles = s_num_tiles;

    // Tile i of the walk: its logical tile (block * tiles_per_block + tile in block), its physical
    // block, and (shared walks of sparse groups) the rows that selected it.
    auto tile_at = [&](int i, int& tile, int64_t& phys, int& rows_mask) {
      rows_mask = 0xf;
      if (kDense) {
        tile = tile_base + i;
        phys = block_phys[tile / tiles_per_block - tile_base / tiles_per_block];
      } else if (!shared_walk) {
        tile = tile_list[i];
        phys = tile_phys[i];
      } else {
        const int e = part_tiles[i], u = e >> 2;
        tile = cand[u] * tiles_per_block + (e & 3);
        phys = union_phys[u];
        rows_mask = union_mask[u];
      }
    };
    auto issue = [&](int i) {
      if (i < num_tiles) {
        int tile, rows_mask;
        int64_t phys;
        tile_at(i, tile, phys, rows_mask);
        const int tok0 = (tile % tiles_per_block) * kTileTokens;
        uint8_t* dst = stages + (i % C::kStages) * C::kStageBytes;
        stage_tile<kFmt, kThreads>(dst, a.cache.kv_row(phys, 0, kv, tok0), a.cache.kv_row_scales(phys, 0, kv, tok0),
                                   tid);
        stage_tile<kFmt, kThreads>(dst + C::kStageBytes / 2, a.cache.kv_row(phys, 1, kv, tok0),
                                   a.cache.kv_row_scales(phys, 1, kv, tok0), tid);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) issue(s);

    // Query tile: [row][head][D], heads past the group zero.
    const int q_rows = shared_walk ? C::kRows : 1;
    for (int c = tid; c < q_rows * 16 * (kDim / 8); c += kThreads) {
      const int r = c / (16 * (kDim / 8)), h = (c / (kDim / 8)) % 16, d8 = (c % (kDim / 8)) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r < wrows && h < group)
        v = load_act8<C::kBf16, C::kNvfp4>(a.q, a.q_kind,
                                           ((int64_t(wrow) + r) * a.num_q_heads + kv * group + h) * kDim + d8);
      *reinterpret_cast<uint4*>(q_tile + (r * 16 + h) * (kTileStride * 2) + d8 * 2) = v;
    }
    __syncthreads();
    const int my_row = shared_walk ? warp : 0;
    const int my_pos = my_row < wrows ? a.step.positions[wrow + my_row] : -1;
    uint32_t qf[kDim / 16][4];
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
      ldmatrix_x4(qf[ks], q_tile + (my_row * 16 + (lane & 15)) * (kTileStride * 2) + (lane >> 4) * 16 + ks * 32);

    const float c2 = a.sm_scale * kLog2e;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float o[kDim / 8][4];
#pragma unroll
    for (int nt = 0; nt < kDim / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[nt][c] = 0.0f;

    for (int i = 0; i < num_tiles; ++i) {
      cp_async_wait<C::kStages - 2>();
      __syncthreads();  // tile i landed; every warp is done with tile i - 1 (and the query tile)
      issue(i + C::kStages - 1);
      const uint8_t* kt = stages + (i % C::kStages) * C::kStageBytes;
      const uint8_t* vt = kt + C::kStageBytes / 2;
      if constexpr (kFmt != KvDType::kBF16) {
        if (shared_walk) {  // every warp reads the whole tile
          expand_tile<kFmt, C::kBf16, kThreads>(kt, table, expanded, tid);
          expand_tile<kFmt, C::kBf16, kThreads>(vt, table, expanded + kTileBytes, tid);
          __syncthreads();
        } else if (!kProbe) {  // each warp expands the 16 rows it reads
          expand_rows<kFmt, C::kBf16, 16, 32>(kt, table, expanded, warp * 16, lane);
          expand_rows<kFmt, C::kBf16, 16, 32>(vt, table, expanded + kTileBytes, warp * 16, lane);
          __syncwarp();
        }
        kt = expanded;
        vt = expanded + kTileBytes;
      }
      int tile, rows_mask;
      int64_t phys;
      tile_at(i, tile, phys, rows_mask);
      const int key_pos0 = tile * kTileTokens;
      if (shared_walk) {
        if (my_row < wrows && (rows_mask >> my_row & 1) && key_pos0 <= my_pos) {
          attend_chunk<C::kNvfp4, 4>(kt, vt, 0, key_pos0, my_pos, c2, qf, m_run, l_run, o, nullptr);
          if (key_pos0 + 32 <= my_pos)
            attend_chunk<C::kNvfp4, 4>(kt, vt, 32, key_pos0, my_pos, c2, qf, m_run, l_run, o, nullptr);
        }
      } else {
        attend_chunk<C::kNvfp4, 2>(kt, vt, warp * 16, key_pos0, my_pos, c2, qf, m_run, l_run, o, s_max);
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Each warp's state to shared memory, then merge (a one-row walk: the 4 warps of the row).
    float* s_o = reinterpret_cast<float*>(area);
    float* s_ml = s_o + 4 * 16 * kDim;
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] = warp_sum_quad(l_run[h]);
#pragma unroll
    for (int nt = 0; nt < kDim / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        s_o[(warp * 16 + g + 8 * (c >> 1)) * kDim + nt * 8 + 2 * t + (c & 1)] = o[nt][c];
    if (t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s_ml[(warp * 16 + g + 8 * h) * 2] = m_run[h];
        s_ml[(warp * 16 + g + 8 * h) * 2 + 1] = l_run[h];
      }
    }
    __syncthreads();

    for (int item = tid; item < wrows * 16 * 8; item += kThreads) {
      const int fr = item >> 7, r = (item >> 3) & 15, d0 = (item & 7) * 16;
      const int w_begin = shared_walk ? fr : 0, w_end = shared_walk ? fr + 1 : 4;
      float m = -INFINITY;
      for (int w = w_begin; w < w_end; ++w) m = fmaxf(m, s_ml[(w * 16 + r) * 2]);
      float l = 0.0f, acc[16];
#pragma unroll
      for (int d = 0; d < 16; ++d) acc[d] = 0.0f;
      for (int w = w_begin; w < w_end; ++w) {
        const float mw = s_ml[(w * 16 + r) * 2];
        const float e = mw == -INFINITY ? 0.0f : ex2_approx((mw - m) * c2);
        l += e * s_ml[(w * 16 + r) * 2 + 1];
#pragma unroll
        for (int d = 0; d < 16; ++d) acc[d] += e * s_o[(w * 16 + r) * kDim + d0 + d];
      }
      if (wpartial >= 0) {
        const int64_t p = wpartial + int64_t(fr) * partial_stride;
#pragma unroll
        for (int d = 0; d < 16; ++d) a.partial_o[(p * kMaxGroup + r) * kDim + d0 + d] = acc[d];
        if (d0 == 0) {
          a.partial_ml[(p * kMaxGroup + r) * 2] = m;
          a.partial_ml[(p * kMaxGroup + r) * 2 + 1] = l;
        }
      } else if (r < group) {
        store_merged(a.out, a.lse, int64_t(wrow + fr) * a.num_q_heads + kv * group + r, d0, acc, m, l, a.sm_scale,
                     C::kNvfp4);
      }
    }
    __syncthreads();  // the merge scratch is the next walk's tile area
  }
}

__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineArgs a) {
  kernel_prologue();
  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  combine_splits<false>(a, a.work[blockIdx.x]);
}

template <KvDType kFmt, bool kDense>
cudaError_t launch_for(const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  constexpr int kSmem = AttnConfig<kFmt, kDense>::kSmemBytes;
  if (kFmt == KvDType::kNVFP4 && !kDense && a.probe_skip_expand)
    launch_kernel(attention_kernel<kFmt, kDense, true>, a.num_work, kThreads, kSmem, stream, a);
  else
    launch_kernel(attention_kernel<kFmt, kDense>, a.num_work, kThreads, kSmem, stream, a);
  return cudaGetLastError();
}

template <bool kDense>
cudaError_t launch_dispatch(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.cache.kv_dtype) {
    case KvDType::kBF16: return launch_for<KvDType::kBF16, kDense>(a, stream);
    case KvDType::kFP8: return launch_for<KvDType::kFP8, kDense>(a, stream);
    case KvDType::kNVFP4: return launch_for<KvDType::kNVFP4, kDense>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <KvDType kFmt, bool kDense, bool kProbe = false>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(attention_kernel<kFmt, kDense, kProbe>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              AttnConfig<kFmt, kDense>::kSmemBytes);
}

}  // namespace

cudaError_t init_attention_kernels() {
  cudaError_t e = cudaSuccess;
  for (cudaError_t r : {allow_smem<KvDType::kBF16, false>(), allow_smem<KvDType::kFP8, false>(),
                        allow_smem<KvDType::kNVFP4, false>(), allow_smem<KvDType::kBF16, true>(),
                        allow_smem<KvDType::kFP8, true>(), allow_smem<KvDType::kNVFP4, true>(),
                        allow_smem<KvDType::kNVFP4, false, true>()})
    if (e == cudaSuccess) e = r;
  return e;
}

int sparse_attention_ctas_per_sm(KvDType kv_dtype) {
  switch (kv_dtype) {
    case KvDType::kBF16:
      return ctas_per_sm(attention_kernel<KvDType::kBF16, false>, AttnConfig<KvDType::kBF16, false>::kSmemBytes);
    case KvDType::kFP8:
      return ctas_per_sm(attention_kernel<KvDType::kFP8, false>, AttnConfig<KvDType::kFP8, false>::kSmemBytes);
    case KvDType::kNVFP4:
      return ctas_per_sm(attention_kernel<KvDType::kNVFP4, false>, AttnConfig<KvDType::kNVFP4, false>::kSmemBytes);
    default: return 1;
  }
}

cudaError_t launch_sparse_attention(const AttentionArgs& a, cudaStream_t stream) {
  return launch_dispatch<false>(a, stream);
}

cudaError_t launch_dense_attention(const AttentionArgs& a, cudaStream_t stream) {
  return launch_dispatch<true>(a, stream);
}

cudaError_t launch_combine(const CombineArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  launch_kernel(combine_kernel, a.num_work, kThreads, 0, stream, a);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
