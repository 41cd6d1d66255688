// Indexer block scores on tensor cores, for decode and chunked prefill alike.
//
// One CTA takes up to 64 MMA rows (query tokens x index heads of one sequence) and a range of
// that sequence's logical blocks. Per 64-token tile: stage the index-K bytes with cp.async
// (3-deep pipeline), S = Q K^T with mma.sync m16n8k16 (fp32 accumulation), mask keys past each
// row's position, max over the keys; after a block's last tile each row's block score goes to the
// score workspace. Each warp owns 16 tokens of every tile.
//
// fp8/nvfp4 keys never pass through an expanded copy: each thread builds its MMA B fragments
// straight from the staged bytes (one 32-bit load = 8 nvfp4 codes or 4 fp8 codes), which is
// possible because the head dimension of Q and K may be permuted alike: K element (token, dim) is
// fed at MMA position logical_position(dim), and Q is stored in that logical order. nvfp4 codes
// become the E4M3 view E4M3(e2m1 * scale) through a per-scale table of the 8 magnitudes (byte
// permutes), then exact fp16 pairs. bf16 keys are staged as a padded tile and read with ldmatrix.
// Bytes: the index cache of the scored blocks, read once per CTA row tile (decode: once).
#include <cmath>

#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;

template <KvDType kFmt>
struct IndexerConfig {
  static constexpr bool kBf16 = kFmt == KvDType::kBF16;  // bf16 cache: bf16 MMA, else fp16
  // Staged row strides, padded so that the 8 token rows a quarter warp reads hit distinct banks.
  static constexpr int kRowBytes = kFmt == KvDType::kNVFP4 ? 80 : kFmt == KvDType::kFP8 ? 144 : kTileStride * 2;
  static constexpr int kScaleOffset = kTileTokens * kRowBytes;  // nvfp4 scale rows follow the data
  static constexpr int kStageBytes = kScaleOffset + (kFmt == KvDType::kNVFP4 ? kTileTokens * kDim / 16 : 0);
  static constexpr int kStages = kFmt == KvDType::kBF16 ? 2 : 3;
  static constexpr int kQBytes = kIndexerRows * kTileStride * 2;
  static constexpr int kTableBytes = kFmt == KvDType::kNVFP4 ? 256 * 8 : 0;
  static constexpr int kRedBytes = 4 * kIndexerRows * 4;
  static constexpr int kRowInfoBytes = 2 * kIndexerRows * 4;  // position, score base per row
  static constexpr int kPageBytes = kIndexerMaxBlocks * 4;
  static constexpr int kSmemBytes =
      kQBytes + kStages * kStageBytes + kTableBytes + kRedBytes + kRowInfoBytes + kPageBytes;
};

// The head-dimension element that MMA position p (k-step p / 16, position p % 16) carries.
template <KvDType kFmt>
__device__ __forceinline__ int element_at(int p) {
  if constexpr (kFmt == KvDType::kBF16) {
    return p;
  } else {
    const int step = p >> 4, q = p & 15;
    const int t = (q & 7) >> 1, e = q & 1, upper = q >> 3, pair = step >> 1, j = step & 1;
    // nvfp4: one 32-bit word = elements 32*pair + 8t .. +7 feed k-steps 2*pair (first four) and
    // 2*pair+1; fp8: one word = elements 16*step + 4t .. +3.
    return kFmt == KvDType::kNVFP4 ? 32 * pair + 8 * t + 4 * j + 2 * upper + e
                                   : 32 * pair + 16 * j + 4 * t + 2 * upper + e;
  }
}

template <KvDType kFmt>
__device__ __forceinline__ void stage_index_tile(uint8_t* dst, const uint8_t* rows, const uint8_t* scale_rows,
                                                 int tid) {
  using C = IndexerConfig<kFmt>;
  if constexpr (kFmt == KvDType::kBF16) {
    stage_tile<kFmt, kThreads>(dst, rows, scale_rows, tid);
  } else {
    constexpr int kChunksPerRow = kDim / (kFmt == KvDType::kNVFP4 ? 2 : 1) / 16;
    constexpr int kData = kTileTokens * kChunksPerRow;
    constexpr int kScale = kFmt == KvDType::kNVFP4 ? kTileTokens * kDim / 16 / 16 : 0;
#pragma unroll
    for (int c = tid; c < kData + kScale; c += kThreads) {
      if (c < kData)
        cp_async16(dst + (c / kChunksPerRow) * C::kRowBytes + (c % kChunksPerRow) * 16, rows + c * 16);
      else
        cp_async16(dst + C::kScaleOffset + (c - kData) * 16, scale_rows + (c - kData) * 16);
    }
  }
}

// 8 nvfp4 codes (one 32-bit word, element 2i in the low nibble of byte i) to four fp16 pairs of
// their E4M3 view; t = the table entry of their scale byte.
__device__ __forceinline__ void nvfp4_word_to_f16(uint32_t x, uint2 t, uint32_t (&f)[4]) {
  // Magnitudes: the table's byte (code & 7). Signs: bit 3 of code 2j sits at bit 7 of byte j of
  // x << 4, that of code 2j+1 at bit 7 of byte j of x.
  const uint32_t shifted = x << 4;
  const uint32_t lo = __byte_perm(t.x, t.y, x & 0x7777u) | (__byte_perm(shifted, x, 0x5140u) & 0x80808080u);
  const uint32_t hi =
      __byte_perm(t.x, t.y, (x >> 16) & 0x7777u) | (__byte_perm(shifted, x, 0x7362u) & 0x80808080u);
  f[0] = e4m3x2_to_f16x2(lo);
  f[1] = e4m3x2_to_f16x2(lo >> 16);
  f[2] = e4m3x2_to_f16x2(hi);
  f[3] = e4m3x2_to_f16x2(hi >> 16);
}

// B fragments of k-steps 2*pair and 2*pair+1 for token row `row` of a staged tile:
// b[0], b[1] feed k-step 2*pair; b[2], b[3] k-step 2*pair+1.
// kProbe (timing only, wrong scores): the nvfp4 words go to the MMA undecoded.
template <KvDType kFmt, bool kProbe>
__device__ __forceinline__ void key_fragments(const uint8_t* stage, const uint2* table, int row, int pair, int t,
                                              uint32_t (&b)[4]) {
  using C = IndexerConfig<kFmt>;
  if constexpr (kFmt == KvDType::kNVFP4) {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(stage + row * C::kRowBytes + 16 * pair + 4 * t);
    if constexpr (kProbe) {
      b[0] = x, b[1] = x >> 8, b[2] = x >> 16, b[3] = x >> 24;
    } else {
      const uint8_t scale = stage[C::kScaleOffset + row * (kDim / 16) + 2 * pair + (t >> 1)];
      nvfp4_word_to_f16(x, table[scale], b);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t x =
          *reinterpret_cast<const uint32_t*>(stage + row * C::kRowBytes + 32 * pair + 16 * j + 4 * t);
      b[2 * j] = e4m3x2_to_f16x2(x);
      b[2 * j + 1] = e4m3x2_to_f16x2(x >> 16);
    }
  }
}

// The loop over tiles. kSingle: at most 16 MMA rows (decode), Q fragments held in registers and
// the accumulation split by k-step parity to halve the dependent MMA chains.
template <KvDType kFmt, bool kSingle, bool kProbe>
__device__ __forceinline__ void score_tiles(const IndexerArgs& a, const IndexerWork& w, uint8_t* q_tile,
                                            uint8_t* stages, const uint2* table, float* red, const int* row_pos,
                                            const int* row_base, const int* s_pages, int rows, int num_tiles) {
  using C = IndexerConfig<kFmt>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int block_size = a.cache.block_size, tiles_per_block = block_size / kTileTokens;
  const int m_tiles = kSingle ? 1 : (rows + 15) / 16;
  constexpr int kM = kSingle ? 1 : 4;

  auto issue = [&](int i) {
    if (i < num_tiles) {
      const int64_t phys = s_pages[i / tiles_per_block];
      const int tok0 = (i % tiles_per_block) * kTileTokens;
      stage_index_tile<kFmt>(stages + (i % C::kStages) * C::kStageBytes, a.cache.index_row(phys, tok0),
                             a.cache.index_row_scales(phys, tok0), tid);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) issue(s);

  const uint8_t* q_frag_base = q_tile + (lane & 15) * (kTileStride * 2) + (lane >> 4) * 16;
  uint32_t qreg[kSingle ? kDim / 16 : 1][4];
  if constexpr (kSingle) {
#pragma unroll
    for (int s = 0; s < kDim / 16; ++s) ldmatrix_x4(qreg[s], q_frag_base + s * 32);
  }
  float wmax[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) wmax[mt][0] = wmax[mt][1] = -INFINITY;

  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    issue(i + C::kStages - 1);
    const uint8_t* stage = stages + (i % C::kStages) * C::kStageBytes;
    const int block = w.block_begin + i / tiles_per_block;
    const int key0 = block * block_size + (i % tiles_per_block) * kTileTokens + warp * 16;

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

#pragma unroll
    for (int pair = 0; pair < kDim / 32; ++pair) {
      uint32_t b[2][4];
      if constexpr (kFmt == KvDType::kBF16) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t r[4];
          ldmatrix_x4(r, stage + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * (kTileStride * 2) +
                             ((lane >> 3) & 1) * 16 + (2 * pair + j) * 32);
          b[0][2 * j] = r[0], b[0][2 * j + 1] = r[1], b[1][2 * j] = r[2], b[1][2 * j + 1] = r[3];
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) key_fragments<kFmt, kProbe>(stage, table, warp * 16 + nt * 8 + g, pair, t, b[nt]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int s = 2 * pair + j;
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          if (mt < m_tiles) {
            uint32_t qa[4];
            if constexpr (kSingle) {
#pragma unroll
              for (int c = 0; c < 4; ++c) qa[c] = qreg[s][c];
            } else {
              ldmatrix_x4(qa, q_frag_base + mt * 16 * (kTileStride * 2) + s * 32);
            }
            const int p = kSingle ? j : 0;
            mma_16816<C::kBf16>(acc[mt][p][0], qa, b[0][2 * j], b[0][2 * j + 1]);
            mma_16816<C::kBf16>(acc[mt][p][1], qa, b[1][2 * j], b[1][2 * j + 1]);
          }
        }
      }
    }
    // Masked max over this warp's 16 keys, kept per warp until the block ends.
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      if (mt < m_tiles) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int pos = row_pos[mt * 16 + g + 8 * half];
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float v = acc[mt][0][nt][2 * half + c];
              if constexpr (kSingle) v += acc[mt][1][nt][2 * half + c];
              if (key0 + nt * 8 + 2 * t + c <= pos) mx = fmaxf(mx, v);
            }
          wmax[mt][half] = fmaxf(wmax[mt][half], warp_max_quad(mx));
        }
      }
    }
    if (i % tiles_per_block == tiles_per_block - 1) {  // block done: merge the 4 warps
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
      if (tid < rows) {
        const float m = fmaxf(fmaxf(red[tid], red[kIndexerRows + tid]),
                              fmaxf(red[2 * kIndexerRows + tid], red[3 * kIndexerRows + tid]));
        if (block <= row_pos[tid] / block_size) a.scores[int64_t(row_base[tid]) + block] = m;
      }
    }
  }
  cp_async_wait<0>();
}

template <KvDType kFmt, bool kProbe>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const IndexerArgs a) {
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
  for (int idx = tid; idx < m_tiles * 16 * (kDim / 8); idx += kThreads) {
    const int m = idx / (kDim / 8), p8 = (idx % (kDim / 8)) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (m < rows) {
      const int64_t base = (int64_t(w.row_begin) * heads + m) * kDim;
      if constexpr (kFmt == KvDType::kBF16) {
        v = load_act8<true, false>(a.index_q, a.q_kind, base + p8);
      } else {
        // Logical positions 2c, 2c+1 hold consecutive elements (element_at(p + 1) = element_at(p) + 1
        // for even p).
        uint32_t h[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) h[c] = load_act2_e4m3_f16(a.index_q, a.q_kind, base + element_at<kFmt>(p8 + 2 * c));
        v = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
    *reinterpret_cast<uint4*>(q_tile + m * (kTileStride * 2) + p8 * 2) = v;
  }
  __syncthreads();
  if (m_tiles == 1)
    score_tiles<kFmt, true, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
  else
    score_tiles<kFmt, false, kProbe>(a, w, q_tile, stages, table, red, row_pos, row_base, s_pages, rows, num_tiles);
}

template <KvDType kFmt>
cudaError_t launch_for(const IndexerArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  constexpr int kSmem = IndexerConfig<kFmt>::kSmemBytes;
  if (kFmt == KvDType::kNVFP4 && a.probe_skip_decode)
    indexer_scores_kernel<kFmt, true><<<a.num_work, kThreads, kSmem, stream>>>(a);
  else
    indexer_scores_kernel<kFmt, false><<<a.num_work, kThreads, kSmem, stream>>>(a);
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

cudaError_t launch_indexer_scores(const IndexerArgs& a, cudaStream_t stream) {
  switch (a.cache.index_dtype) {
    case KvDType::kBF16: return launch_for<KvDType::kBF16>(a, stream);
    case KvDType::kFP8: return launch_for<KvDType::kFP8>(a, stream);
    case KvDType::kNVFP4: return launch_for<KvDType::kNVFP4>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace m3::cuda::detail
