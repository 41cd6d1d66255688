// Linear layers over quantized weights: y = x W^T with W expanded to bf16 in registers (never a
// dequantized copy in memory), bf16 tensor cores (mma.sync m16n8k16), fp32 accumulation.
//
// Two tensor-core kernels share the chunk decoders of weight_decode.cuh:
//  - skinny (decode-shaped, items of <= 64 rows): no shared-memory weight tile. Each lane streams
//    16-byte chunks of its weight row with non-caching loads and builds the MMA B fragments from
//    them directly, using a permutation of K that the A fragments (x, read from L1) follow too:
//    lane q of a quad owns kElems contiguous elements of every 4 * kElems. A CTA of 4 warps covers
//    16 output features; its warps split K and reduce through shared memory.
//  - tiled (prefill-shaped, items of 128 rows): 128 x 128 (64 x 2 for SwiGLU) tiles, K steps of
//    64, x staged by cp.async, weight chunks expanded into a bf16 shared tile, ldmatrix + mma.
// Weights that cannot be expanded exactly to bf16 (f32, f16, fp8 with 128x128 block scales) or
// whose rows are not 16-byte chunks take an exact fp32 SIMT kernel (fixtures, odd shapes).
#include <cuda_bf16.h>

#include "formats/nvfp4.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {
namespace {

struct ItemInfo {
  LinearItem item;
  bool valid;
};

__device__ __forceinline__ ItemInfo item_of(const LinearArgs& a, unsigned index) {
  ItemInfo r;
  if (a.items != nullptr) {
    r.valid = int(index) < *a.num_items;
    if (r.valid) r.item = a.items[index];
  } else {
    r.item.expert = 0;
    r.item.row_begin = int(index) * a.item_rows;
    r.item.row_count = min(a.item_rows, a.rows - r.item.row_begin);
    r.valid = r.item.row_count > 0;
  }
  return r;
}

__device__ __forceinline__ WeightView weight_of(const LinearArgs& a, int j, int expert) {
  return a.table[j] != nullptr ? a.table[j][expert] : a.w[j];
}

__device__ __forceinline__ int64_t src_row(const LinearArgs& a, int r) {
  return a.x_rows != nullptr ? a.x_rows[r] : r;
}

// Stores one output element (kStore) or combines gate and up (kSwiglu).
template <bool kSwiglu>
__device__ __forceinline__ float epilogue_value(const LinearArgs& a, const WeightView* w, const float* v) {
  if constexpr (kSwiglu) {
    const float g = round_bf16(apply_out_scale(w[0], v[0]));
    const float u = round_bf16(apply_out_scale(w[1], v[1]));
    return swiglu_oai_bf16(g, u, a.swiglu_alpha, a.swiglu_limit);
  } else {
    return apply_out_scale(w[0], v[0]);
  }
}

// ---------------------------------------------------------------------------------------------
// Skinny kernel: kSkinnyWarps warps split K; 16 output features per CTA. Bandwidth comes from the
// number of weight loads in flight: each lane issues all the loads of U consecutive K chunks
// (skinny_loads_per_lane 16-byte loads, whatever NW and NT) before it decodes any of them, and a
// CTA of 8 warps keeps 8 x 32 x 8 x 16 bytes (32 KB) in flight at 8 loads per lane.

constexpr int kSkinnyWarps = 8;
constexpr int kSkinnyMaxDenseRows = 256;

// 16-byte weight loads per lane per batch: 8, or 4 for 64-row tiles (their accumulators and x
// fragments take the registers). Double-buffering smaller batches (issue the next batch's loads
// before this batch's mma) measured 5-17% slower at 32-128 rows (docs/gpu-backend-notes.md).
template <int MT>
constexpr int skinny_loads_per_lane() {
  return MT >= 4 ? 4 : 8;
}
// Two CTAs (16 warps, 64 KB of loads in flight) per SM for 16-row tiles (<= 128 registers; the
// nvfp4/mxfp8 SwiGLU forms spill 16/4 bytes); larger tiles need more registers than that.
template <int MT>
constexpr int skinny_min_ctas() {
  return MT == 1 ? 2 : 1;
}

template <WeightKind F, int MT, bool kSwiglu>
__global__ void __launch_bounds__(kSkinnyWarps * 32, skinny_min_ctas<MT>())
    skinny_linear_kernel(const LinearArgs a) {
  using Fmt = WeightFmt<F>;
  constexpr int E = Fmt::kElems, KC = 4 * E, NT = 2, NW = kSwiglu ? 2 : 1, SUBS = E / 8;
  constexpr int U = skinny_loads_per_lane<MT>() / (NW * NT) > 0 ? skinny_loads_per_lane<MT>() / (NW * NT) : 1;
  // Accumulator sets: 16-row tiles of a single weight alternate two between chunks, so that a
  // warp has four independent mma.sync chains as with SwiGLU's two weights (registers allow it).
  constexpr int AS = MT == 1 && NW == 1 && U > 1 ? 2 : 1;
  // Item index fastest (blockIdx.x): the row tiles of one weight slice run together, so a dense
  // layer of more than 64 rows reads its weight from DRAM once and the other tiles hit L2.
  const ItemInfo info = item_of(a, blockIdx.x);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.y * 8 * NT;
  WeightView w[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);

  const uint16_t* xrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      xrow[mt][h] = r < item.row_count ? a.x + src_row(a, item.row_begin + r) * a.x_stride : nullptr;
    }
  const uint8_t* wrow[NW][NT];
  const uint8_t* srow[NW][NT];
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = n0 + nt * 8 + g;
      wrow[j][nt] = n < a.n ? w[j].data + int64_t(n) * w[j].row_bytes : nullptr;
      srow[j][nt] = n < a.n && w[j].scale != nullptr ? w[j].scale + int64_t(n) * w[j].scale_stride : nullptr;
    }

  float acc[AS][NW][NT][MT][4];
#pragma unroll
  for (int as = 0; as < AS; ++as)
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[as][j][nt][mt][c] = 0.0f;

  // Chunk c covers elements [c KC, (c + 1) KC); warp w takes chunks [w U, w U + U) of every
  // kSkinnyWarps U, so each lane's U loads per row are contiguous.
  const int num_chunks = (a.k + KC - 1) / KC;
  using Raw = uint4[U][NW][NT];
  using Scales = ChunkScale[U][NW][NT];
  auto load = [&](int c0, Raw& raw, Scales& sc) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k0 = int64_t(c0 + u) * KC + q * E;
      const bool active = k0 < a.k;
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (active && wrow[j][nt] != nullptr) {
            raw[u][j][nt] = load_stream16(wrow[j][nt] + Fmt::byte_offset(k0));
            sc[u][j][nt] = load_chunk_scale<F>(srow[j][nt], k0);
          } else {
            raw[u][j][nt] = make_uint4(0, 0, 0, 0);
            sc[u][j][nt] = ChunkScale();
          }
        }
    }
  };
  auto compute = [&](int c0, const Raw& raw, const Scales& sc) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k0 = int64_t(c0 + u) * KC + q * E;
      const bool active = k0 < a.k;
#pragma unroll
      for (int s = 0; s < SUBS; ++s) {
        uint4 xa[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            xa[mt][h] = active && xrow[mt][h] != nullptr
                            ? *reinterpret_cast<const uint4*>(xrow[mt][h] + k0 + 8 * s)
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint4 b = decode_sub<F>(raw[u][j][nt], s, sc[u][j][nt]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const uint32_t a0[4] = {xa[mt][0].x, xa[mt][1].x, xa[mt][0].y, xa[mt][1].y};
              const uint32_t a1[4] = {xa[mt][0].z, xa[mt][1].z, xa[mt][0].w, xa[mt][1].w};
              mma_16816<true>(acc[u % AS][j][nt][mt], a0, b.x, b.y);
              mma_16816<true>(acc[u % AS][j][nt][mt], a1, b.z, b.w);
            }
          }
      }
    }
  };
  Raw raw;
  Scales sc;
  for (int c0 = warp * U; c0 < num_chunks; c0 += kSkinnyWarps * U) {
    load(c0, raw, sc);
    compute(c0, raw, sc);
  }
#pragma unroll
  for (int as = 1; as < AS; ++as)
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[0][j][nt][mt][c] += acc[as][j][nt][mt][c];

  // Split-K reduction over the warps (fixed order), one 16-row tile at a time, then the epilogue.
  __shared__ float red[kSkinnyWarps][NW * NT * 4][32];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[warp][(j * NT + nt) * 4 + c][lane] = acc[0][j][nt][mt][c];
    __syncthreads();
    for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
      const int ln = e & 31, c = (e >> 5) & 3, nt = e >> 7;
      const int row = mt * 16 + (ln >> 2) + (c >= 2 ? 8 : 0);
      const int col = n0 + nt * 8 + 2 * (ln & 3) + (c & 1);
      if (row >= item.row_count || col >= a.n) continue;
      float v[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const int slot = (j * NT + nt) * 4 + c;
        float sum = red[0][slot][ln];
#pragma unroll
        for (int wi = 1; wi < kSkinnyWarps; ++wi) sum += red[wi][slot][ln];
        v[j] = sum;
      }
      const float y = epilogue_value<kSwiglu>(a, w, v);
      a.out[int64_t(item.row_begin + row) * a.out_stride + col] = f32_to_bf16_bits(y);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------
// Tiled kernel: 256 threads, 8 warps as 4 (M) x 2 (N), BM = 128, BK = 64.

constexpr int kTileM = 128;
constexpr int kTileK = 64;
constexpr int kTileStrideH = kTileK + 8;  // halves per smem row (144 bytes: ldmatrix conflict-free)

template <bool kSwiglu>
constexpr int tiled_bn() {
  return kSwiglu ? 64 : 128;
}
template <bool kSwiglu>
constexpr int tiled_smem_bytes() {
  return 2 * (kTileM + (kSwiglu ? 2 : 1) * tiled_bn<kSwiglu>()) * kTileStrideH * 2;
}

template <WeightKind F, bool kSwiglu>
__global__ void __launch_bounds__(256) tiled_linear_kernel(const LinearArgs a) {
  using Fmt = WeightFmt<F>;
  constexpr int E = Fmt::kElems, NW = kSwiglu ? 2 : 1, BN = tiled_bn<kSwiglu>();
  constexpr int WN = BN / 2, NI = WN / 8, MI = 2;  // warp tile 32 x WN
  constexpr int A_CHUNKS = kTileM * kTileK / 8 / 256;        // 16-byte x chunks per thread
  constexpr int B_CHUNKS = NW * BN * (kTileK / E) / 256;     // weight chunks per thread
  static_assert(A_CHUNKS >= 1 && B_CHUNKS >= 1, "tile shape");
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* As = reinterpret_cast<uint16_t*>(smem);                    // [2][BM][stride]
  uint16_t* Bs = As + 2 * kTileM * kTileStrideH;                       // [2][NW * BN][stride]

  const ItemInfo info = item_of(a, blockIdx.y);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 1, wn = warp & 1;
  const int n0 = blockIdx.x * BN;
  WeightView w[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);

  // The x rows this thread stages, and the weight chunks it expands.
  const uint16_t* arow[A_CHUNKS];
  int a_col[A_CHUNKS], a_srow[A_CHUNKS];
#pragma unroll
  for (int i = 0; i < A_CHUNKS; ++i) {
    const int id = tid + i * 256, r = id / (kTileK / 8);
    a_srow[i] = r;
    a_col[i] = (id % (kTileK / 8)) * 8;
    arow[i] = r < item.row_count ? a.x + src_row(a, item.row_begin + r) * a.x_stride : nullptr;
  }
  const uint8_t* brow[B_CHUNKS];
  const uint8_t* bscale[B_CHUNKS];
  int b_slot[B_CHUNKS], b_col[B_CHUNKS];
#pragma unroll
  for (int i = 0; i < B_CHUNKS; ++i) {
    const int id = tid + i * 256;
    const int per_row = kTileK / E;
    const int slot = id / per_row;  // j * BN + n
    const int j = slot / BN, n = n0 + slot % BN;
    b_slot[i] = slot;
    b_col[i] = (id % per_row) * E;
    brow[i] = n < a.n ? w[j].data + int64_t(n) * w[j].row_bytes : nullptr;
    bscale[i] = n < a.n && w[j].scale != nullptr ? w[j].scale + int64_t(n) * w[j].scale_stride : nullptr;
  }

  auto stage_a = [&](int kt, int buf) {
    uint16_t* dst = As + buf * kTileM * kTileStrideH;
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
      const int k = kt * kTileK + a_col[i];
      uint16_t* d = dst + a_srow[i] * kTileStrideH + a_col[i];
      if (arow[i] != nullptr && k < a.k) cp_async16(d, arow[i] + k);
      else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
    cp_async_commit();
  };
  uint4 braw[B_CHUNKS];
  ChunkScale bsc[B_CHUNKS];
  auto load_b = [&](int kt) {
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i) {
      const int64_t k = int64_t(kt) * kTileK + b_col[i];
      if (brow[i] != nullptr && k < a.k) {
        braw[i] = load_stream16(brow[i] + Fmt::byte_offset(k));
        bsc[i] = load_chunk_scale<F>(bscale[i], k);
      } else {
        braw[i] = make_uint4(0, 0, 0, 0);
        bsc[i] = ChunkScale();
      }
    }
  };
  auto store_b = [&](int buf) {
    uint16_t* dst = Bs + buf * NW * BN * kTileStrideH;
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i)
#pragma unroll
      for (int s = 0; s < E / 8; ++s)
        *reinterpret_cast<uint4*>(dst + b_slot[i] * kTileStrideH + b_col[i] + 8 * s) =
            decode_sub<F>(braw[i], s, bsc[i]);
  };

  float acc[NW][MI][NI][4];
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][mi][ni][c] = 0.0f;

  const int k_tiles = (a.k + kTileK - 1) / kTileK;
  stage_a(0, 0);
  load_b(0);
  store_b(0);
  cp_async_wait<0>();
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < k_tiles;
    if (more) {
      stage_a(kt + 1, cur ^ 1);
      load_b(kt + 1);
    }
    const uint16_t* at = As + cur * kTileM * kTileStrideH;
    const uint16_t* bt = Bs + cur * NW * BN * kTileStrideH;
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        const int mat = lane >> 3;
        const int r = wm * 32 + mi * 16 + (mat & 1) * 8 + (lane & 7);
        ldmatrix_x4(af[mi], at + r * kTileStrideH + ks * 16 + (mat >> 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int np = 0; np < NI / 2; ++np) {
          uint32_t bf[4];
          const int mat = lane >> 3;
          const int n = j * BN + wn * WN + np * 16 + (mat >> 1) * 8 + (lane & 7);
          ldmatrix_x4(bf, bt + n * kTileStrideH + ks * 16 + (mat & 1) * 8);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            mma_16816<true>(acc[j][mi][2 * np], af[mi], bf[0], bf[1]);
            mma_16816<true>(acc[j][mi][2 * np + 1], af[mi], bf[2], bf[3]);
          }
        }
    }
    if (more) {
      store_b(cur ^ 1);
      cp_async_wait<0>();
    }
    __syncthreads();
  }

  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wm * 32 + mi * 16 + g + 8 * h;
        const int col = n0 + wn * WN + ni * 8 + 2 * q;
        if (row >= item.row_count) continue;
        uint16_t* o = a.out + int64_t(item.row_begin + row) * a.out_stride + col;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (col + c >= a.n) continue;
          float v[NW];
#pragma unroll
          for (int j = 0; j < NW; ++j) v[j] = acc[j][mi][ni][2 * h + c];
          o[c] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, w, v));
        }
      }
}

// ---------------------------------------------------------------------------------------------
// Exact SIMT kernel: one warp per output feature, element-wise dequantization as dequantize_rows.

__device__ float weight_value(const WeightView& w, int64_t n, int64_t k) {
  const uint8_t* row = w.data + n * w.row_bytes;
  switch (w.kind) {
    case WeightKind::kBF16:
      return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[k]);
    case WeightKind::kF16:
      return __half2float(reinterpret_cast<const __half*>(row)[k]);
    case WeightKind::kF32:
      return reinterpret_cast<const float*>(row)[k];
    case WeightKind::kFp8:
      return fp8_e4m3_decode(row[k]) * (w.scale ? *reinterpret_cast<const float*>(w.scale) : 1.0f);
    case WeightKind::kFp8Block:
      return fp8_e4m3_decode(row[k]) *
             reinterpret_cast<const float*>(w.scale)[(n / 128) * w.scale_stride + k / 128];
    case WeightKind::kMxfp8:
      return fp8_e4m3_decode(row[k]) * ue8m0_decode(w.scale[n * w.scale_stride + k / 32]);
    case WeightKind::kNvfp4: {
      const uint8_t byte = row[k >> 1];
      const uint8_t code = (k & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xf);
      const float v = e2m1_decode(code) * fp8_e4m3_decode(w.scale[n * w.scale_stride + k / 16]);
      return w.out_div != 0.0f ? v / w.out_div : v * w.out_mul;
    }
  }
  return 0.0f;
}

template <bool kSwiglu>
__global__ void __launch_bounds__(256) simt_linear_kernel(const LinearArgs a) {
  constexpr int NW = kSwiglu ? 2 : 1;
  const ItemInfo info = item_of(a, blockIdx.y);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.x * 8 + warp;
  if (n >= a.n) return;
  WeightView w[NW];
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);
  for (int r = 0; r < item.row_count; ++r) {
    const uint16_t* x = a.x + src_row(a, item.row_begin + r) * a.x_stride;
    float v[NW];
    for (int j = 0; j < NW; ++j) {
      float s = 0.0f;
      for (int k = lane; k < a.k; k += 32) s += bf16_bits_to_f32(x[k]) * weight_value(w[j], n, k);
      v[j] = warp_sum(s);
    }
    if (lane == 0) {
      float y;
      if constexpr (kSwiglu) {
        y = swiglu_oai_bf16(round_bf16(v[0]), round_bf16(v[1]), a.swiglu_alpha, a.swiglu_limit);
      } else {
        y = v[0];
      }
      a.out[int64_t(item.row_begin + r) * a.out_stride + n] = f32_to_bf16_bits(y);
    }
  }
}

template <WeightKind F, bool kSwiglu>
cudaError_t launch_mma(const LinearArgs& a, int items, cudaStream_t stream) {
  if (a.item_rows > 64) {
    constexpr int bn = tiled_bn<kSwiglu>();
    const dim3 grid((a.n + bn - 1) / bn, items);
    tiled_linear_kernel<F, kSwiglu><<<grid, 256, tiled_smem_bytes<kSwiglu>(), stream>>>(a);
    return cudaGetLastError();
  }
  const dim3 grid(items, (a.n + 15) / 16);
  constexpr int threads = kSkinnyWarps * 32;
  switch (a.item_rows) {
    case 16:
      skinny_linear_kernel<F, 1, kSwiglu><<<grid, threads, 0, stream>>>(a);
      break;
    case 32:
      skinny_linear_kernel<F, 2, kSwiglu><<<grid, threads, 0, stream>>>(a);
      break;
    default:
      skinny_linear_kernel<F, 4, kSwiglu><<<grid, threads, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

template <bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int items, cudaStream_t stream) {
  switch (a.w[0].kind) {
    case WeightKind::kBF16:
      return launch_mma<WeightKind::kBF16, kSwiglu>(a, items, stream);
    case WeightKind::kFp8:
      return launch_mma<WeightKind::kFp8, kSwiglu>(a, items, stream);
    case WeightKind::kMxfp8:
      return launch_mma<WeightKind::kMxfp8, kSwiglu>(a, items, stream);
    case WeightKind::kNvfp4:
      return launch_mma<WeightKind::kNvfp4, kSwiglu>(a, items, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <WeightKind F>
cudaError_t set_tiled_smem() {
  cudaError_t e = cudaFuncSetAttribute(tiled_linear_kernel<F, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       tiled_smem_bytes<false>());
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(tiled_linear_kernel<F, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              tiled_smem_bytes<true>());
}

int chunk_elems(WeightKind kind) {
  switch (kind) {
    case WeightKind::kBF16:
      return 8;
    case WeightKind::kFp8:
    case WeightKind::kMxfp8:
      return 16;
    case WeightKind::kNvfp4:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

bool linear_has_mma_path(const WeightView& w, int k) {
  const int e = chunk_elems(w.kind);
  if (e == 0 || k % e != 0 || w.row_bytes % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0) return false;
  // kNvfp4 loads a chunk's two group scales as one 2-byte word.
  if (w.kind == WeightKind::kNvfp4 && (w.scale_stride % 2 != 0 || reinterpret_cast<uintptr_t>(w.scale) % 2 != 0))
    return false;
  // kNvfp4 reads two group scales per 32-element chunk, kMxfp8 one per 16 (inside one block).
  return true;
}

int linear_item_rows(const WeightView& w, int k, int rows, bool grouped) {
  if (!linear_has_mma_path(w, k)) return 16;
  if (rows <= 16) return 16;
  if (rows <= 32) return 32;
  if (rows <= 64) return 64;
  // A dense layer of up to kSkinnyMaxDenseRows rows stays memory-bound: 64-row skinny tiles read
  // the weight from DRAM once (the other tiles of a slice hit L2, see skinny_linear_kernel) with
  // n / 16 CTAs, where the tiled kernel would have only n / 128.
  if (!grouped && rows <= kSkinnyMaxDenseRows) return 64;
  return kTileM;
}

cudaError_t init_linear_kernels() {
  cudaError_t e;
  if ((e = set_tiled_smem<WeightKind::kBF16>()) != cudaSuccess) return e;
  if ((e = set_tiled_smem<WeightKind::kFp8>()) != cudaSuccess) return e;
  if ((e = set_tiled_smem<WeightKind::kMxfp8>()) != cudaSuccess) return e;
  return set_tiled_smem<WeightKind::kNvfp4>();
}

cudaError_t launch_linear(const LinearArgs& a, cudaStream_t stream) {
  const int items = a.items != nullptr ? a.max_items : (a.rows + a.item_rows - 1) / a.item_rows;
  if (items <= 0 || a.n <= 0) return cudaSuccess;
  const bool swiglu = a.epilogue == Epilogue::kSwiglu;
  bool mma = linear_has_mma_path(a.w[0], a.k) && (!swiglu || a.w[1].kind == a.w[0].kind);
  if (swiglu && mma) mma = linear_has_mma_path(a.w[1], a.k);
  if (mma && a.x_stride % 8 != 0) mma = false;
  if (!mma) {
    const dim3 grid((a.n + 7) / 8, items);
    if (swiglu) simt_linear_kernel<true><<<grid, 256, 0, stream>>>(a);
    else simt_linear_kernel<false><<<grid, 256, 0, stream>>>(a);
    return cudaGetLastError();
  }
  return swiglu ? launch_kind<true>(a, items, stream) : launch_kind<false>(a, items, stream);
}

}  // namespace m3::cuda::detail
