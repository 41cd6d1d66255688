// Indexer block scores on tensor cores, for decode and chunked prefill alike.
//
// One CTA takes up to 64 MMA rows (query tokens x index heads of one sequence) and a range of
// that sequence's logical blocks. Per 64-token tile: stage the index-K bytes with cp.async,
// S = Q K^T on tensor cores (fp32 accumulation), mask keys past each row's position, max over the
// keys; after a block's last tile each row's block score goes to the score workspace. Each warp
// owns 16 tokens of every tile.
//
// fp8 and nvfp4 caches meet E4M3 index queries (ops/attention.h), so their products are E4M3 x
// E4M3 and run on Hopper's FP8 tensor cores: wgmma m64nNk32 (the CTA is one warpgroup), the 64
// keys of a tile as A from registers, the CTA's <= 64 query rows as B from shared memory, fp32
// accumulation. (mma.sync with E4M3 inputs is no FP8 instruction on sm_90: ptxas converts the
// operands to fp16 for HMMA, which costs more than fp16 fragments do.) The keys never pass
// through an expanded copy: each thread builds its A fragments straight from the staged bytes,
// which is possible because the head dimension of Q and K may be permuted alike: K element
// (token, dim) is fed at MMA position logical_position(dim), and Q is stored in that logical
// order. The permutation gives each thread one contiguous run of a token row (nvfp4: 16 bytes,
// 32 codes; fp8: 32 bytes) and the 8 lanes of a shared-memory phase 128 distinct bytes (unpadded
// nvfp4 rows of 64 bytes, fp8 rows padded to 144). fp8 bytes are A fragments as they are; nvfp4
// codes become the E4M3 view E4M3(e2m1 * scale) through a per-scale table of the 8 magnitudes
// (byte permutes). bf16 caches keep bf16 queries: a padded tile read with ldmatrix, mma.sync.
//
// The kernel is bound by the bytes it keeps in flight and the instructions it spends per byte
// (decode reads the index cache once at ~28 FLOP per byte): nvfp4 tiles are 4.6 KB, so the
// pipeline is 7 tiles deep (fp8 4) with 4 CTAs per multiprocessor (docs/msa-kernels-notes.md, v5).
// Bytes: the index cache of the scored blocks, read once per CTA row tile (decode: once).
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;

template <KvDType kFmt>
struct IndexerConfig {
  static constexpr bool kWgmma = kFmt != KvDType::kBF16;  // E4M3 x E4M3 on wgmma, else bf16 mma.sync
  static constexpr int kSteps = kWgmma ? kDim / 32 : kDim / 16;  // MMA k-steps per row
  // Staged row strides: the two token rows of one 16-byte-load phase hit distinct banks (nvfp4:
  // rows of 64 bytes side by side; fp8: 144 = 128 + 16).
  static constexpr int kRowBytes = kFmt == KvDType::kNVFP4 ? 64 : kFmt == KvDType::kFP8 ? 144 : kTileStride * 2;
  static constexpr int kScaleOffset = kTileTokens * kRowBytes;  // nvfp4 scale rows follow the data
  static constexpr int kStageBytes = kScaleOffset + (kFmt == KvDType::kNVFP4 ? kTileTokens * kDim / 16 : 0);
  // Tiles in the pipeline (kStages - 1 in flight): 43 / 46 KB of shared memory per CTA, 4-5 CTAs
  // per multiprocessor keep ~100 KB of loads in flight.
  static constexpr int kStages = kFmt == KvDType::kBF16 ? 2 : kFmt == KvDType::kNVFP4 ? 7 : 4;
  // Query rows: E4M3 bytes in wgmma's K-major core matrices (wgmma_q_offset), or bf16 rows.
  static constexpr int kQRowBytes = kWgmma ? kDim : kTileStride * 2;
  static constexpr int kQBytes = kIndexerRows * kQRowBytes;
  static constexpr int kTableBytes = kFmt == KvDType::kNVFP4 ? 256 * 8 : 0;
  static constexpr int kRedBytes = 4 * kIndexerRows * 4;
  static constexpr int kRowInfoBytes = 2 * kIndexerRows * 4;  // position, score base per row
  static constexpr int kPageBytes = kIndexerMaxBlocks * 4;
  static constexpr int kSmemBytes =
      kQBytes + kStages * kStageBytes + kTableBytes + kRedBytes + kRowInfoBytes + kPageBytes;
};

// The head-dimension element that logical position p of a query row carries (bf16: MMA position
// p; E4M3: byte p, in the key rows' order of wgmma.cuh).
template <KvDType kFmt>
__device__ __forceinline__ int element_at(int p) {
  if constexpr (kFmt == KvDType::kBF16) return p;
  else return e4m3_row_element(p);
}

// The copies of one 64-token tile of index-K into a stage. fp8/nvfp4 take their per-thread
// offsets from constants and tid alone (a tile costs a few integer adds per 16-byte chunk: the
// generic row helpers' dtype switches are not in the loop); bf16 uses the shared tile stager.
template <KvDType kFmt>
__device__ __forceinline__ void stage_index_tile(uint8_t* dst, const KvLayerView& cache, const uint8_t* slot,
                                                 int tok0, int tid) {
  using C = IndexerConfig<kFmt>;
  if constexpr (kFmt == KvDType::kBF16) {
    stage_tile<kFmt, kThreads>(dst, slot + int64_t(tok0) * kDim * 2, nullptr, tid);
  } else if constexpr (kFmt == KvDType::kNVFP4) {
    static_assert(C::kScaleOffset == kTileTokens * kDim / 2, "stage_tile's nvfp4 layout");
    stage_tile<kFmt, kThreads>(dst, slot + tok0 * (kDim / 2), slot + cache.block_size * (kDim / 2) + tok0 * (kDim / 16),
                               tid);
  } else {
    const uint8_t* rows = slot + tok0 * kDim;  // 512 chunks, rows of 128 bytes padded to 144
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = tid + k * kThreads;
      cp_async16(dst + (c >> 3) * C::kRowBytes + (c & 7) * 16, rows + c * 16);
    }
  }
}

// E4M3 fragments of all 4 k-steps for token row `row` of a staged fp8/nvfp4 tile: b[s][0] holds
// MMA positions 4t..4t+3 of k-step s, b[s][1] positions 16+4t..16+4t+3. fp8: the thread's 32 bytes in two 16-byte loads (rows 144 bytes apart,
// so each phase's two rows take all 32 banks); nvfp4: its 16 bytes of codes, one word per k-step.
// kProbe (timing only, wrong scores): the nvfp4 words go to the MMA undecoded.
template <KvDType kFmt, bool kProbe>
__device__ __forceinline__ void key_fragments(const uint8_t* stage, const uint2* table, int row, int t,
                                              uint32_t (&b)[kDim / 32][2]) {
  using C = IndexerConfig<kFmt>;
  if constexpr (kFmt == KvDType::kNVFP4) {
    if constexpr (kProbe) {
      const uint4 x = *reinterpret_cast<const uint4*>(stage + row * C::kRowBytes + 16 * t);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) b[s][0] = w[s], b[s][1] = w[s] >> 4;
    } else {
      static_assert(C::kRowBytes == 64 && C::kScaleOffset == 64 * 64, "nvfp4_key_row's tile layout");
      nvfp4_key_row(stage, table, row, t, b);
    }
  } else {
    const uint8_t* base = stage + row * C::kRowBytes + 32 * t;
    const uint4 lo = *reinterpret_cast<const uint4*>(base), hi = *reinterpret_cast<const uint4*>(base + 16);
    b[0][0] = lo.x, b[0][1] = lo.y, b[1][0] = lo.z, b[1][1] = lo.w;
    b[2][0] = hi.x, b[2][1] = hi.y, b[3][0] = hi.z, b[3][1] = hi.w;
  }
}

// After a block's last tile, with each warp's row maxima in red[warp][row] (and a barrier): the
// block's score of each row, max over the 4 warps, unless the block lies past the row.
__device__ __forceinline__ void write_block_scores(const IndexerArgs& a, const float* red, const int* row_pos,
                                                   const int* row_base, int rows, int block) {
  const int tid = threadIdx.x;
  if (tid < rows) {
    const float m = fmaxf(fmaxf(red[tid], red[kIndexerRows + tid]),
                          fmaxf(red[2 * kIndexerRows + tid], red[3 * kIndexerRows + tid]));
    if (block <= row_pos[tid] / a.cache.block_size) a.scores[int64_t(row_base[tid]) + block] = m;
  }
}

// The cp.async pipeline over a CTA's tiles: kStages - 1 tiles in flight, counters instead of
// divisions. next_tile() waits for the next tile, then (after the CTA barrier that frees the
// oldest stage) issues the one kStages - 1 further on.
template <KvDType kFmt>
struct TilePipeline {
  using C = IndexerConfig<kFmt>;
  const KvLayerView& cache;
  const int* pages;
  uint8_t* stages;
  const uint8_t* index_base;
  int num_tiles, tiles_per_block;
  int next = 0, next_block = 0, next_sub = 0, next_stage = 0, cur_stage = 0;

  __device__ TilePipeline(const KvLayerView& c, const int* p, uint8_t* st, int n, int tpb)
      : cache(c), pages(p), stages(st), index_base(c.index_slot(0)), num_tiles(n), tiles_per_block(tpb) {}

  __device__ __forceinline__ void issue(int tid) {
    if (next < num_tiles)
      stage_index_tile<kFmt>(stages + next_stage * C::kStageBytes, cache,
                             index_base + pages[next_block] * cache.block_bytes, next_sub * kTileTokens, tid);
    cp_async_commit();
    ++next;
    if (++next_sub == tiles_per_block) next_sub = 0, ++next_block;
    if (++next_stage == C::kStages) next_stage = 0;
  }
  __device__ __forceinline__ void start(int tid) {
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) issue(tid);
  }
  __device__ __forceinline__ const uint8_t* next_tile(int tid) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    issue(tid);
    const uint8_t* stage = stages + cur_stage * C::kStageBytes;
    if (++cur_stage == C::kStages) cur_stage = 0;
    return stage;
  }
};

// The loop over tiles of an fp8/nvfp4 cache: per tile one wgmma chain m64nNk32 x 4 (the warp's 16
// keys as A rows, the CTA's <= N query rows as B columns), then each thread's running maximum of
// its 2 keys per column; at a block's end the maxima of the 16 keys of each warp (lanes of equal
// t), then of the 4 warps.
template <KvDType kFmt, int N, bool kProbe>
__device__ __forceinline__ void score_tiles_wgmma(const IndexerArgs& a, const IndexerWork& w, const uint8_t* q_tile,
                                                  uint8_t* stages, const uint2* table, float* red, const int* row_pos,
                                                  const int* row_base, const int* s_pages, int rows, int num_tiles) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int block_size = a.cache.block_size, tiles_per_block = block_size / kTileTokens;
  TilePipeline<kFmt> pipe(a.cache, s_pages, stages, num_tiles, tiles_per_block);
  pipe.start(tid);
  constexpr int kSteps = IndexerConfig<kFmt>::kSteps;
  uint64_t qdesc[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) qdesc[s] = wgmma_desc(q_tile + 2 * s * kQCoreK, kQCoreK, kQCoreN);
  float wmax[N / 4];  // per 8 columns j: columns 8j + 2t, 8j + 2t + 1
#pragma unroll
  for (int c = 0; c < N / 4; ++c) wmax[c] = -INFINITY;

  int sub = 0, block = w.block_begin;
  for (int i = 0; i < num_tiles; ++i) {
    const uint8_t* stage = pipe.next_tile(tid);
    const int key0 = block * block_size + sub * kTileTokens + warp * 16;
    uint32_t kb[2][kSteps][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) key_fragments<kFmt, kProbe>(stage, table, warp * 16 + nt * 8 + g, t, kb[nt]);
    float d[N / 2];
#pragma unroll
    for (int c = 0; c < N / 2; ++c) d[c] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t af[4] = {kb[0][s][0], kb[1][s][0], kb[0][s][1], kb[1][s][1]};
      wgmma_e4m3<N>(d, af, qdesc[s], s > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_pin<N>(d);
    // Rows of d are keys key0 + g and key0 + g + 8; columns are query rows, in position order.
    if (key0 + 15 <= row_pos[0]) {
#pragma unroll
      for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) wmax[2 * j + c] = fmaxf(wmax[2 * j + c], fmaxf(d[4 * j + c], d[4 * j + 2 + c]));
    } else {
#pragma unroll
      for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int pos = row_pos[8 * j + 2 * t + c];
          if (key0 + g <= pos) wmax[2 * j + c] = fmaxf(wmax[2 * j + c], d[4 * j + c]);
          if (key0 + g + 8 <= pos) wmax[2 * j + c] = fmaxf(wmax[2 * j + c], d[4 * j + 2 + c]);
        }
    }
    if (++sub == tiles_per_block) {  // block done: merge the lanes of equal t, then the 4 warps
      sub = 0;
#pragma unroll
      for (int c = 0; c < N / 4; ++c) {
        float m = wmax[c];
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (g == 0) red[warp * kIndexerRows + 8 * (c >> 1) + 2 * t + (c & 1)] = m;
        wmax[c] = -INFINITY;
      }
      __syncthreads();
      write_block_scores(a, red, row_pos, row_base, rows, block);
      ++block;
    }
  }
  cp_async_wait<0>();
}

// The loop over tiles of a bf16 cache (mma.sync). kSingle: at most 16 MMA rows (decode), Q
// fragments held in registers and the accumulation split by k-step parity to halve the dependent
// MMA chains.
template <KvDType kFmt, bool kSingle, bool kProbe>
__device__ __forceinline__ void score_tiles(const IndexerArgs& a, const IndexerWork& w, uint8_t* q_tile,
                                            uint8_t* stages, const uint2* table, float* red, const int* row_pos,
                                            const int* row_base, const int* s_pages, int rows, int num_tiles) {
  using C = IndexerConfig<kFmt>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int block_size = a.cache.block_size, tiles_per_block = block_size / kTileTokens;
  const int m_tiles = kSingle ? 1 : (rows + 15) / 16;
  constexpr int kM = kSingle ? 1 : 4;

  TilePipeline<kFmt> pipe(a.cache, s_pages, stages, num_tiles, tiles_per_block);
  pipe.start(tid);

  const uint8_t* q_frag_base = q_tile + (lane & 15) * C::kQRowBytes + (lane >> 4) * 16;
  uint32_t qreg[kSingle ? C::kSteps : 1][4];
  if constexpr (kSingle) {
#pragma unroll
    for (int s = 0; s < C::kSteps; ++s) ldmatrix_x4(qreg[s], q_frag_base + s * 32);
  }
  float wmax[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) wmax[mt][0] = wmax[mt][1] = -INFINITY;

  int sub = 0, block = w.block_begin;
  for (int i = 0; i < num_tiles; ++i) {
    const uint8_t* stage = pipe.next_tile(tid);
    const int key0 = block * block_size + sub * kTileTokens + warp * 16;

    constexpr int kParity = kSingle ? 2 : 1;
    float acc[kM][kParity][2][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int p = 0; p < kParity; ++p)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mt][p][nt][c] = 0.0f;

    // B fragments of both 8-token halves of the warp's 16 keys, every k-step.
    uint32_t kb[2][C::kSteps][2];
#pragma unroll
    for (int s = 0; s < C::kSteps; ++s) {
      uint32_t r[4];
      ldmatrix_x4(r, stage + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * (kTileStride * 2) +
                         ((lane >> 3) & 1) * 16 + s * 32);
      kb[0][s][0] = r[0], kb[0][s][1] = r[1], kb[1][s][0] = r[2], kb[1][s][1] = r[3];
    }
#pragma unroll
    for (int s = 0; s < C::kSteps; ++s) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        if (mt < m_tiles) {
          uint32_t qa[4];
          if constexpr (kSingle) {
#pragma unroll
            for (int c = 0; c < 4; ++c) qa[c] = qreg[s][c];
          } else {
            ldmatrix_x4(qa, q_frag_base + mt * 16 * C::kQRowBytes + s * 32);
          }
          const int p = kParity == 2 ? (s & 1) : 0;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) mma_16816<true>(acc[mt][p][nt], qa, kb[nt][s][0], kb[nt][s][1]);
        }
      }
    }
    // Max over this thread's keys of the tile, kept per thread until the block ends. Rows are in
    // position order, so the mask is needed only where a key passes the first row's position.
    const bool unmasked = key0 + 15 <= row_pos[0];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      if (mt < m_tiles) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int pos = row_pos[mt * 16 + g + 8 * half];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float v = acc[mt][0][nt][2 * half + c];
              if constexpr (kParity == 2) v += acc[mt][kParity - 1][nt][2 * half + c];
              if (unmasked || key0 + nt * 8 + 2 * t + c <= pos) wmax[mt][half] = fmaxf(wmax[mt][half], v);
            }
        }
      }
    }
    if (++sub == tiles_per_block) {  // block done: merge the quads, then the 4 warps
      sub = 0;
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) wmax[mt][half] = warp_max_quad(wmax[mt][half]);
      if (t == 0) {
#pragma unroll
        for (int mt = 0; mt < kM; ++mt)
          if (mt < m_tiles) {
            red[warp * kIndexerRows + mt * 16 + g] = wmax[mt][0];
            red[warp * kIndexerRows + mt * 16 + g + 8] = wmax[mt][1];
          }
      }
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) wmax[mt][0] = wmax[mt][1] = -INFINITY;
      __syncthreads();
      write_block_scores(a, red, row_pos, row_base, rows, block);
      ++block;
    }
  }
  cp_async_wait<0>();
}

template <KvDType kFmt, bool kProbe>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const IndexerArgs a) {
  kernel_prologue();
  using C = IndexerConfig<kFmt>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_tile = smem;
  uint8_t* stages = q_tile + C::kQBytes;
  uint2* table = reinterpret_cast<uint2*>(stages + C::kStages * C::kStageBytes);
  float* red = reinterpret_cast<float*>(stages + C::kStages * C::kStageBytes + C::kTableBytes);
  int* row_pos = reinterpret_cast<int*>(red + 4 * kIndexerRows);
  int* row_base = row_pos + kIndexerRows;  // score index of block 0 for the row
  int* s_pages = row_base + kIndexerRows;

  if (a.device_num_work != nullptr && int(blockIdx.x) >= *a.device_num_work) return;  // graph mode surplus
  const IndexerWork w = a.work[blockIdx.x];
  const int tid = threadIdx.x;
  const int heads = a.index_heads;
  const int rows = w.row_count * heads;
  const int block_size = a.cache.block_size;
  const int num_tiles = (w.block_end - w.block_begin) * (block_size / kTileTokens);
  // Everything the loop reads from global metadata goes to shared memory first, so that no
  // tile waits on a dependent global load.
  const int32_t* pages = a.step.page_table + int64_t(w.seq) * a.step.pages_per_seq;
  for (int c = tid; c < w.block_end - w.block_begin; c += kThreads) s_pages[c] = pages[w.block_begin + c];
  if (tid < kIndexerRows) {
    const int pos = tid < rows ? a.step.positions[w.row_begin + tid / heads] : -1;
    row_pos[tid] = pos;
    if (tid < rows)
      row_base[tid] = a.score_offset[w.row_begin + tid / heads] * heads + (tid % heads) * (pos / block_size + 1);
  }
  if constexpr (kFmt == KvDType::kNVFP4) {
    for (int c = tid; c < 128; c += kThreads) cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  }
  // Q in the MMA's logical element order; rows past `rows` are zero.
  const int m_tiles = (rows + 15) / 16;
  if constexpr (C::kWgmma) {
    const int n = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
    for (int idx = tid; idx < n * (kDim / 4); idx += kThreads) {
      const int m = idx / (kDim / 4), p4 = (idx % (kDim / 4)) * 4;
      uint32_t v = 0;
      if (m < rows)  // logical bytes p4 .. p4+3 hold consecutive elements
        v = load_act4_e4m3(a.index_q, a.q_kind, (int64_t(w.row_begin) * heads + m) * kDim + element_at<kFmt>(p4));
      *reinterpret_cast<uint32_t*>(q_tile + wgmma_q_offset(m, p4)) = v;
    }
    fence_async_shared();  // the tensor cores read Q
    __syncthreads();
    if (n == 8)
      score_tiles_wgmma<kFmt, 8, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
    else if (n == 16)
      score_tiles_wgmma<kFmt, 16, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
    else if (n == 32)
      score_tiles_wgmma<kFmt, 32, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
    else
      score_tiles_wgmma<kFmt, 64, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
  } else {
    for (int idx = tid; idx < m_tiles * 16 * (kDim / 8); idx += kThreads) {
      const int m = idx / (kDim / 8), p8 = (idx % (kDim / 8)) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (m < rows) v = load_act8<true, false>(a.index_q, a.q_kind, (int64_t(w.row_begin) * heads + m) * kDim + p8);
      *reinterpret_cast<uint4*>(q_tile + m * C::kQRowBytes + p8 * 2) = v;
    }
    __syncthreads();
    if (m_tiles == 1)
      score_tiles<kFmt, true, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
    else
      score_tiles<kFmt, false, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
  }
}

template <KvDType kFmt>
cudaError_t launch_for(const IndexerArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  constexpr int kSmem = IndexerConfig<kFmt>::kSmemBytes;
  if (kFmt == KvDType::kNVFP4 && a.probe_skip_decode)
    launch_kernel(indexer_scores_kernel<kFmt, true>, a.num_work, kThreads, kSmem, stream, a);
  else
    launch_kernel(indexer_scores_kernel<kFmt, false>, a.num_work, kThreads, kSmem, stream, a);
  return cudaGetLastError();
}

template <KvDType kFmt, bool kProbe>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(indexer_scores_kernel<kFmt, kProbe>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              IndexerConfig<kFmt>::kSmemBytes);
}

}  // namespace

cudaError_t init_indexer_kernels() {
  cudaError_t e = allow_smem<KvDType::kBF16, false>();
  if (e == cudaSuccess) e = allow_smem<KvDType::kFP8, false>();
  if (e == cudaSuccess) e = allow_smem<KvDType::kNVFP4, false>();
  if (e == cudaSuccess) e = allow_smem<KvDType::kNVFP4, true>();
  return e;
}

int indexer_ctas_per_sm(KvDType index_dtype) {
  switch (index_dtype) {
    case KvDType::kBF16:
      return ctas_per_sm(indexer_scores_kernel<KvDType::kBF16, false>, IndexerConfig<KvDType::kBF16>::kSmemBytes);
    case KvDType::kFP8:
      return ctas_per_sm(indexer_scores_kernel<KvDType::kFP8, false>, IndexerConfig<KvDType::kFP8>::kSmemBytes);
    case KvDType::kNVFP4:
      return ctas_per_sm(indexer_scores_kernel<KvDType::kNVFP4, false>, IndexerConfig<KvDType::kNVFP4>::kSmemBytes);
    default: return 1;
  }
}

cudaError_t launch_indexer_scores(const IndexerArgs& a, cudaStream_t stream) {
  switch (a.cache.index_dtype) {
    case KvDType::kBF16: return launch_for<KvDType::kBF16>(a, stream);
    case KvDType::kFP8: return launch_for<KvDType::kFP8>(a, stream);
    case KvDType::kNVFP4: return launch_for<KvDType::kNVFP4>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace m3::cuda::detail
