// Indexer block scores on tensor cores, for decode and chunked prefill alike.
//
// One CTA takes up to 64 MMA rows (query tokens x index heads of one sequence) and a range of
// that sequence's logical blocks. Per 64-token tile: stage the index-K bytes with cp.async
// (3-deep pipeline), expand fp8/nvfp4 to fp16 in shared memory, S = Q K^T with mma.sync
// (fp32 accumulation), mask keys past each row's position, max over the tile's keys; after the
// block's last tile each row's block score goes to the score workspace.
// Bytes: the index cache of the visible blocks, read once per CTA row-tile (decode: once).
#include <cfloat>
#include <cmath>

#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;

template <KvDType kFmt>
struct IndexerConfig {
  static constexpr bool kBf16 = kFmt == KvDType::kBF16;  // bf16 cache: bf16 MMA, else fp16
  static constexpr int kStages = kFmt == KvDType::kBF16 ? 2 : 3;
  static constexpr int kStageBytes = staged_tile_bytes(kFmt);
  static constexpr int kQBytes = kIndexerRows * kTileStride * 2;
  static constexpr int kExpandBytes = kFmt == KvDType::kBF16 ? 0 : kTileBytes;
  static constexpr int kTableBytes = kFmt == KvDType::kNVFP4 ? 256 * 8 : 0;
  static constexpr int kRedBytes = 4 * kIndexerRows * 4;
  static constexpr int kRowBytes = 2 * kIndexerRows * 4;  // position, score base per row
  static constexpr int kPageBytes = kIndexerMaxBlocks * 4;
  static constexpr int kSmemBytes =
      kQBytes + kExpandBytes + kStages * kStageBytes + kTableBytes + kRedBytes + kRowBytes + kPageBytes;
};

template <KvDType kFmt>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const IndexerArgs a) {
  using C = IndexerConfig<kFmt>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_tile = smem;
  uint8_t* k_tile = q_tile + C::kQBytes;
  uint8_t* stages = k_tile + C::kExpandBytes;
  uint2* table = reinterpret_cast<uint2*>(stages + C::kStages * C::kStageBytes);
  float* red = reinterpret_cast<float*>(stages + C::kStages * C::kStageBytes + C::kTableBytes);
  int* row_pos = reinterpret_cast<int*>(red + 4 * kIndexerRows);
  int* row_base = row_pos + kIndexerRows;  // score index of block 0 for the row
  int* s_pages = row_base + kIndexerRows;

  const IndexerWork w = a.work[blockIdx.x];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int heads = a.index_heads;
  const int rows = w.row_count * heads;
  const int block_size = a.cache.block_size;
  const int tiles_per_block = block_size / kTileTokens;
  const int num_tiles = (w.block_end - w.block_begin) * tiles_per_block;
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
  __syncthreads();

  auto issue = [&](int i) {
    if (i < num_tiles) {
      const int64_t phys = s_pages[i / tiles_per_block];
      const int tok0 = (i % tiles_per_block) * kTileTokens;
      stage_tile<kFmt, kThreads>(stages + (i % C::kStages) * C::kStageBytes, a.cache.index_row(phys, tok0),
                       a.cache.index_row_scales(phys, tok0), tid);
    }
    cp_async_commit();
  };

  if constexpr (kFmt == KvDType::kNVFP4) {
    for (int c = tid; c < 128; c += kThreads) cp_async16(table + 2 * c, a.e4m3_table + 2 * c);
  }
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) issue(s);

  const int m_tiles = (rows + 15) / 16;
  for (int c = tid; c < m_tiles * 16 * (kDim / 8); c += kThreads) {
    const int m = c / (kDim / 8), d8 = (c % (kDim / 8)) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (m < rows)
      v = load_act8<C::kBf16, !C::kBf16>(a.index_q, a.q_kind,
                                         (int64_t(w.row_begin) * heads + m) * kDim + d8);
    *reinterpret_cast<uint4*>(q_tile + m * (kTileStride * 2) + d8 * 2) = v;
  }
  float run_max = -INFINITY;  // thread tid owns MMA row tid across tiles

  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    issue(i + C::kStages - 1);
    const uint8_t* kt = stages + (i % C::kStages) * C::kStageBytes;
    if constexpr (kFmt != KvDType::kBF16) {
      expand_tile<kFmt, false, kThreads>(kt, table, k_tile, tid);
      __syncthreads();
      kt = k_tile;
    }
    const int block = w.block_begin + i / tiles_per_block;
    const int key0 = block * block_size + (i % tiles_per_block) * kTileTokens + warp * 16;

    float acc[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;

    const uint8_t* k_frag_base =
        kt + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * (kTileStride * 2) + ((lane >> 3) & 1) * 16;
    const uint8_t* q_frag_base = q_tile + (lane & 15) * (kTileStride * 2) + (lane >> 4) * 16;
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      uint32_t kb[4];
      ldmatrix_x4(kb, k_frag_base + ks * 32);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if (mt < m_tiles) {
          uint32_t qa[4];
          ldmatrix_x4(qa, q_frag_base + mt * 16 * (kTileStride * 2) + ks * 32);
          mma_16816<C::kBf16>(acc[mt][0], qa, kb[0], kb[1]);
          mma_16816<C::kBf16>(acc[mt][1], qa, kb[2], kb[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      if (mt < m_tiles) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mt * 16 + g + 8 * half;
          const int pos = row_pos[r];
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c)
              if (key0 + nt * 8 + 2 * t + c <= pos) mx = fmaxf(mx, acc[mt][nt][2 * half + c]);
          mx = warp_max_quad(mx);
          if (t == 0) red[warp * kIndexerRows + r] = mx;
        }
      }
    }
    __syncthreads();
    if (tid < rows) {
      const float m = fmaxf(fmaxf(red[tid], red[kIndexerRows + tid]),
                            fmaxf(red[2 * kIndexerRows + tid], red[3 * kIndexerRows + tid]));
      run_max = fmaxf(run_max, m);
      if (i % tiles_per_block == tiles_per_block - 1) {
        if (block <= row_pos[tid] / block_size) a.scores[int64_t(row_base[tid]) + block] = run_max;
        run_max = -INFINITY;
      }
    }
  }
  cp_async_wait<0>();
}

template <KvDType kFmt>
cudaError_t launch_for(const IndexerArgs& a, cudaStream_t stream) {
  if (a.num_work == 0) return cudaSuccess;
  indexer_scores_kernel<kFmt>
      <<<a.num_work, kThreads, IndexerConfig<kFmt>::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

template <KvDType kFmt>
cudaError_t allow_smem() {
  return cudaFuncSetAttribute(indexer_scores_kernel<kFmt>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              IndexerConfig<kFmt>::kSmemBytes);
}

}  // namespace

cudaError_t init_indexer_kernels() {
  cudaError_t e = allow_smem<KvDType::kBF16>();
  if (e == cudaSuccess) e = allow_smem<KvDType::kFP8>();
  if (e == cudaSuccess) e = allow_smem<KvDType::kNVFP4>();
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
