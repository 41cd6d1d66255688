// Linear layers over quantized weights: y = x W^T with W expanded to bf16 in registers (never a
// dequantized copy in memory), bf16 tensor cores, fp32 accumulation.
//
// Three tensor-core kernels share the chunk decoders of weight_decode.cuh:
//  - streamed (items of 16, 32 or 64 rows whose weights pass streamed_weight_ok;
//    linear_streamed.cu): persistent CTAs, weight stages copied into shared memory by a producer
//    warp, the fastest at decode sizes (docs/gpu-backend-notes.md, sessions 16 and 17);
//  - skinny (decode-shaped, items of <= 64 rows, for weights the streamed kernel cannot take): no
//    shared-memory weight tile. Each lane streams
//    16-byte chunks of its weight row with non-caching loads and builds the MMA B fragments from
//    them directly, using a permutation of K that the A fragments (x, read from L1) follow too:
//    lane q of a quad owns kElems contiguous elements of every 4 * kElems. A CTA of 8 warps covers
//    16 output features; its warps split K and reduce through shared memory (dense 64-row tiles
//    with few feature slices also split K over a 2-CTA cluster, reduced through DSMEM).
//  - wgmma (items of up to 256 rows: prefill, grouped experts of 64 rows and more (items of up to
//    64 rows on its 64-row size, two CTAs an SM), dense layers of 33-256 rows with at least
//    kWgmmaMinDenseWeightRows weight rows (up to 64 rows on the 64-row size), their K split over
//    a cluster when the tiles are too few to fill the GPU; linear_wgmma.cu): 128 weight rows x the
//    item's rows a CTA, raw weight bytes staged by cp.async and x rows by TMA (cp.async where they
//    are gathered), the weights expanded to bf16 in registers as the MMA's A operand, x tiles read
//    from shared memory (Hopper warpgroup MMAs with register A).
// Weights that cannot be expanded exactly to bf16 (f32, f16, fp8 with 128x128 block scales) or
// whose rows are not 16-byte chunks take an exact fp32 SIMT kernel (fixtures, odd shapes).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <type_traits>

#include "formats/nvfp4.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Skinny kernel: kSkinnyWarps warps split K; 16 output features per CTA. A dense layer with too
// few 16-feature slices to fill the GPU (k/v: 512 features = 32 CTAs) also splits K across the
// gridDim.z CTAs of a thread-block cluster, which reduce through distributed shared memory in
// fixed order (rank, then warp): deterministic, no workspace, no second launch. Bandwidth comes from the
// number of weight loads in flight: each lane issues all the loads of U consecutive K chunks
// (skinny_loads_per_lane 16-byte loads, whatever NW and NT) before it decodes any of them, and a
// CTA of 8 warps keeps 8 x 32 x 8 x 16 bytes (32 KB) in flight at 8 loads per lane.

constexpr int kSkinnyWarps = 8;
constexpr int kSkinnyMaxDenseRows = 256;
// Dense layers of 33-256 rows with at least this many weight rows (48 CTAs) take the wgmma kernel
// (one item, N up to 256; up to 64 rows its 64-row size) rather than the streamed kernel's wide
// form (64-row items, each expanding the whole weight again). H100, session 30, 12 M3.1 layers at
// 8K (docs/gpu-backend-notes.md): decode steps of 96 / 128 / 192 rows 20.2 / 21.6 / 25.5 ms against
// 20.4 / 22.1 / 27.0; the shared expert at 256 rows 112 against 151 us (gate/up + SwiGLU), 56
// against 81 (down). o_proj alone (K 8192) is 3-13% slower on it at 96-128 rows, but the shared
// expert's 48 CTAs beside the routed experts shorten the MoE op by more; requiring 16384 weight
// rows up to 128 rows gave 22.0 ms at 128. Session 48 extended it to 33-64 rows (linear_item_rows).
constexpr int kWgmmaMinDenseWeightRows = 6144;

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
// K chunks (4 lanes x one 16-byte load each) a warp loads per batch, over NW weights x 2 8-feature tiles.
template <int MT, int NW>
constexpr int skinny_chunks_per_batch() {
  return skinny_loads_per_lane<MT>() / (NW * 2) > 0 ? skinny_loads_per_lane<MT>() / (NW * 2) : 1;
}

template <WeightKind F, int MT, bool kSwiglu>
__global__ void __launch_bounds__(kSkinnyWarps * 32, skinny_min_ctas<MT>())
    skinny_linear_kernel(const LinearArgs a) {
  kernel_prologue();
  using Fmt = WeightFmt<F>;
  constexpr int E = Fmt::kElems, KC = 4 * E, NT = 2, NW = kSwiglu ? 2 : 1, SUBS = E / 8;
  constexpr int U = skinny_chunks_per_batch<MT, NW>();
  // Accumulator sets: 16-row tiles of a single weight alternate two between chunks, so that a
  // warp has four independent mma.sync chains as with SwiGLU's two weights (registers allow it).
  constexpr int AS = MT == 1 && NW == 1 && U > 1 ? 2 : 1;
  // Item index fastest (blockIdx.x): the row tiles of one weight slice run together, so a dense
  // layer of more than 64 rows reads its weight from DRAM once and the other tiles hit L2.
  const ItemInfo info = item_of(a, blockIdx.x);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int splits = gridDim.z;  // CTAs of one cluster splitting K (1: no cluster)
  WeightView w[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);
  int slice = blockIdx.y, n_limit = a.n;
  uint16_t* out = a.out;
  int64_t out_stride = a.out_stride;
  if (a.num_segments > 0) {  // several weights in one launch: find this slice's
    const int s = segment_of(a, slice);
    slice -= a.seg[s].slice_begin;
    n_limit = a.seg[s].n;
    out = a.seg[s].out;
    out_stride = a.seg[s].out_stride;
    w[0] = a.seg[s].w;
  }
  const int n0 = slice * 8 * NT;

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
      wrow[j][nt] = n < n_limit ? w[j].data + int64_t(n) * w[j].row_bytes : nullptr;
      srow[j][nt] = n < n_limit && w[j].scale != nullptr ? w[j].scale + int64_t(n) * w[j].scale_stride : nullptr;
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

  // Chunk c covers elements [c KC, (c + 1) KC); warp w of split z takes chunks [v U, v U + U)
  // with v = z kSkinnyWarps + w, of every splits kSkinnyWarps U, so each lane's U loads per row
  // are contiguous.
  const int num_chunks = (a.k + KC - 1) / KC;
  using Raw = uint4[U][NW][NT];
  using Scales = FastScale[U][NW][NT];
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
            sc[u][j][nt] = load_fast_scale<F>(srow[j][nt], k0);
          } else {
            raw[u][j][nt] = make_uint4(0, 0, 0, 0);
            sc[u][j][nt] = FastScale();
          }
        }
    }
  };
  // kExact: mxfp8 batches with a block exponent above kMxfp8FastMaxExp expand through the float
  // path (decode_sub); real checkpoints never get there.
  auto compute = [&](int c0, const Raw& raw, const Scales& sc, auto exact) {
    constexpr bool kExact = decltype(exact)::value;
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
            const uint4 b = expand_sub<F, kExact>(raw[u][j][nt], s, sc[u][j][nt]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mma_sub(acc[u % AS][j][nt][mt], xa[mt][0], xa[mt][1], b);
          }
      }
    }
  };
  Raw raw;
  Scales sc;
  for (int c0 = (int(blockIdx.z) * kSkinnyWarps + warp) * U; c0 < num_chunks; c0 += splits * kSkinnyWarps * U) {
    load(c0, raw, sc);
    if constexpr (F == WeightKind::kMxfp8) {
      uint32_t top = 0;  // the pairs grow with the exponent
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) top = max(top, sc[u][j][nt].pair[0]);
      if (__any_sync(0xFFFFFFFFu, top > mx_fast_pair(kMxfp8FastMaxExp))) {
        compute(c0, raw, sc, std::true_type());
        continue;
      }
    }
    compute(c0, raw, sc, std::false_type());
  }
  // decode_sub_fast's nvfp4 weights are 2^-kNvfp4AccShift times the true ones: undo it on the
  // fp32 sums (exact).
  if constexpr (F == WeightKind::kNvfp4) {
#pragma unroll
    for (int as = 0; as < AS; ++as)
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[as][j][nt][mt][c] *= float(1 << kNvfp4AccShift);
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

  // Split-K reduction (fixed order): over the warps of each CTA, then over the cluster's CTAs in
  // rank order on rank 0, one 16-row tile at a time, then the epilogue.
  constexpr int kSlots = NW * NT * 4;
  __shared__ float red[kSkinnyWarps][kSlots][32];
  __shared__ float part[kSlots * 32];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) red[warp][(j * NT + nt) * 4 + c][lane] = acc[0][j][nt][mt][c];
    __syncthreads();
    for (int e = threadIdx.x; e < kSlots * 32; e += blockDim.x) {
      float sum = red[0][e >> 5][e & 31];
#pragma unroll
      for (int wi = 1; wi < kSkinnyWarps; ++wi) sum += red[wi][e >> 5][e & 31];
      part[e] = sum;
    }
    if (splits > 1) cluster.sync();
    else __syncthreads();
    if (blockIdx.z == 0) {
      for (int e = threadIdx.x; e < NT * 4 * 32; e += blockDim.x) {
        const int ln = e & 31, c = (e >> 5) & 3, nt = e >> 7;
        const int row = mt * 16 + (ln >> 2) + (c >= 2 ? 8 : 0);
        const int col = n0 + nt * 8 + 2 * (ln & 3) + (c & 1);
        if (row >= item.row_count || col >= n_limit) continue;
        float v[NW];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          const int idx = ((j * NT + nt) * 4 + c) * 32 + ln;
          float sum = part[idx];
          for (int r = 1; r < splits; ++r) sum += cluster.map_shared_rank(part, r)[idx];
          v[j] = sum;
        }
        const float y = epilogue_value<kSwiglu>(a, w, v);
        out[int64_t(item.row_begin + row) * out_stride + col] = f32_to_bf16_bits(y);
      }
    }
    // No CTA leaves (or overwrites part) while rank 0 may still read its shared memory.
    if (splits > 1) cluster.sync();
    else __syncthreads();
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
  kernel_prologue();
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

// CTAs of one cluster that split K for a dense problem of `slices` CTAs (items x 16-feature
// slices): doubled up to max_splits while the grid still fits one wave (skinny_min_ctas per SM)
// and every CTA keeps at least one warp's batch of U chunks.
int skinny_splits(int slices, int num_chunks, int u, int ctas_per_sm, int max_splits) {
  if (max_splits <= 1) return 1;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  int splits = 1;
  while (splits < max_splits && int64_t(slices) * splits * 2 <= int64_t(sms) * ctas_per_sm &&
         num_chunks >= 2 * splits * u)
    splits *= 2;
  return splits;
}

template <WeightKind F, int MT, bool kSwiglu>
cudaError_t launch_skinny(const LinearArgs& a, int items, cudaStream_t stream) {
  constexpr int U = skinny_chunks_per_batch<MT, kSwiglu ? 2 : 1>();
  const int slices = linear_slices(a);
  const int num_chunks = (a.k + 4 * WeightFmt<F>::kElems - 1) / (4 * WeightFmt<F>::kElems);
  // Grouped (MoE) problems have max_items x slices CTAs already; only dense ones split. Measured
  // (docs/gpu-backend-notes.md, round 2): 2 splits help 64-row tiles (k_proj at 128 rows 19.1 ->
  // 15.9 us); 4-8 splits were slower everywhere (k_proj 1 row 9.6 -> 11.3 us at 8, 64 rows 19.4
  // -> 23.9 us at 4): rank 0 reads the other ranks' partial sums one rank after the other.
  constexpr int kMaxSplits = MT >= 4 ? 2 : 1;
  const int splits =
      a.items == nullptr ? skinny_splits(items * slices, num_chunks, U, skinny_min_ctas<MT>(), kMaxSplits) : 1;
  return launch_cluster_kernel(skinny_linear_kernel<F, MT, kSwiglu>, dim3(items, slices, splits),
                               dim3(kSkinnyWarps * 32), dim3(1, 1, splits), 0, stream, a);
}

// Items of up to this many rows in a grouped list of 256- or 320-row items (the routed experts of a
// prefill step: the experts' tails past their large items, and the experts that got few rows) take
// the streamed kernel's narrow form, the rest the wgmma kernel. On the wgmma kernel such an item
// cost about a full item's K-step chain for a few rows (its 64-row size: the 8K prompt's tails 1.87
// of a layer's 9.9 ms of routed GEMMs, ~0.5 TB/s of weights, docs/gpu-backend-notes.md "Session
// 39"), where the streamed kernel reads an expert's weights at 2-3 TB/s for up to 16 rows.
constexpr int kStreamedSmallItemRows = 16;

template <WeightKind F, bool kSwiglu>
cudaError_t launch_mma(const LinearArgs& a, int items, cudaStream_t stream) {
  if (linear_runs_wgmma(a)) {
    if (a.items != nullptr && a.item_rows > 64) {
      LinearArgs small = a;
      small.item_rows = kStreamedSmallItemRows;
      small.streamed_items_up_to = kStreamedSmallItemRows;
      if (streamed_linear_ok(small)) {
        const cudaError_t e = launch_linear_streamed(small, items, stream);
        if (e != cudaSuccess) return e;
        LinearArgs rest = a;
        rest.streamed_items_up_to = kStreamedSmallItemRows;
        return launch_linear_wgmma(rest, items, stream);
      }
    }
    return launch_linear_wgmma(a, items, stream);
  }
  if (streamed_linear_ok(a)) return launch_linear_streamed(a, items, stream);
  switch (a.item_rows) {
    case 16:
      return launch_skinny<F, 1, kSwiglu>(a, items, stream);
    case 32:
      return launch_skinny<F, 2, kSwiglu>(a, items, stream);
    default:
      return launch_skinny<F, 4, kSwiglu>(a, items, stream);
  }
}

template <bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int items, cudaStream_t stream) {
  return dispatch_mma_kind(a.w[0].kind, [&](auto kind) { return launch_mma<decltype(kind)::value, kSwiglu>(a, items, stream); });
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

int linear_item_rows(const WeightView& w, int k, int weight_rows, int rows, bool grouped) {
  if (!linear_has_mma_path(w, k)) return 16;
  if (rows <= 16) return 16;
  if (rows <= 32) return 32;
  // A wide dense layer of 33-64 rows takes the wgmma kernel too (launch_linear_wgmma runs its
  // 64-row size, two CTAs an SM, with K split over a cluster) rather than the streamed kernel's
  // 64-row items. H100, `backend_check bench --only split-k` (docs/gpu-backend-notes.md "Session
  // 48"): M3.1's fused attention projections at 48-64 rows 40-41 us against 54-55, o_proj 37-38
  // against 43, the dense down projection 55-56 against 69-70; at 24-32 rows (the streamed
  // kernel's 32-row items) the streamed kernel was 2-8 us faster.
  if (rows <= 64) return !grouped && weight_rows >= kWgmmaMinDenseWeightRows ? kWgmmaItemRows : 64;
  // A narrow dense layer of up to kSkinnyMaxDenseRows rows stays on the streamed kernel's wide
  // form (64-row items): it reads the weight once with n / 16 CTAs, where the wgmma kernel would
  // have only n / 128 (k_proj's 512 features: 4).
  if (!grouped && rows <= kSkinnyMaxDenseRows && weight_rows < kWgmmaMinDenseWeightRows) return 64;
  // A grouped list (the experts' SwiGLU and store launches alike) takes the widest size the kind
  // has; dense launches 256 (wgmma_max_item_rows says why).
  return grouped ? wgmma_max_item_rows(w.kind) : kWgmmaItemRows;
}

cudaError_t init_linear_kernels() {
  const cudaError_t e = init_linear_wgmma_kernels();
  return e != cudaSuccess ? e : init_linear_streamed_kernels();
}

cudaError_t launch_linear(const LinearArgs& a, cudaStream_t stream) {
  const int items = a.items != nullptr ? a.max_items : (a.rows + a.item_rows - 1) / a.item_rows;
  if (a.num_segments > 0) {
    // The skinny, streamed and wgmma kernels walk segments (dense, kStore); the caller
    // (CudaBackend::fused_linears) checked that every weight shares w[0]'s kind and has the
    // tensor-core path.
    if (a.num_segments > kMaxLinearSegments || a.items != nullptr ||
        (a.item_rows > 64 && a.item_rows != kWgmmaItemRows) || a.epilogue != Epilogue::kStore || a.x_stride % 8 != 0)
      return cudaErrorInvalidValue;
    if (items <= 0) return cudaSuccess;
    return launch_kind<false>(a, items, stream);
  }
  if (items <= 0 || a.n <= 0) return cudaSuccess;
  const bool swiglu = a.epilogue == Epilogue::kSwiglu;
  bool mma = linear_has_mma_path(a.w[0], a.k) && (!swiglu || a.w[1].kind == a.w[0].kind);
  if (swiglu && mma) mma = linear_has_mma_path(a.w[1], a.k);
  if (mma && a.x_stride % 8 != 0) mma = false;
  if (!mma) {
    const dim3 grid((a.n + 7) / 8, items);
    if (swiglu) launch_kernel(simt_linear_kernel<true>, grid, 256, 0, stream, a);
    else launch_kernel(simt_linear_kernel<false>, grid, 256, 0, stream, a);
    return cudaGetLastError();
  }
  return swiglu ? launch_kind<true>(a, items, stream) : launch_kind<false>(a, items, stream);
}

}  // namespace m3::cuda::detail
