// Prefill-shaped linear layers (items of up to 256 or 320 rows) on Hopper's warpgroup MMA: y = x W^T with
// the weights expanded to bf16 in registers (never a dequantized copy in memory), fp32
// accumulation. Same numerics as the skinny kernel (linear.cu): exact bf16 expansion of the
// weights, the second-level / per-tensor scale and the SwiGLU epilogue on the fp32 sum; only the
// fp32 summation order differs.
//
// The weights are the MMA's A operand, from registers (wgmma m64nNk16, register A): a CTA takes
// 128 weight rows (two warpgroups of 64: 128 features, or 64 gate + 64 up features for the fused
// SwiGLU, so that a thread holds a feature's gate and up sums together) and the item's rows
// (tokens) as B, N = 64, 128, 192, 256 or 320 of them, from shared memory. The kernel comes in three
// sizes (TileSize): items of up to 256 or 320 rows (the latter two MMAs a k16 step), one CTA an SM,
// and items of up to 64 rows (grouped launches: small experts and the tails of large ones), two
// CTAs an SM. Per K step of 64:
//  - the x rows (a 128-byte-swizzled K-major tile, the layout wgmma reads through a descriptor)
//    and the raw weight bytes (nvfp4 32, fp8 64, bf16 128 bytes a row, rows padded so that the 8
//    rows a warp reads at once fall in distinct banks) are staged kStages - 1 steps ahead: the
//    weights by cp.async, x by TMA where its rows are contiguous (one thread, N / 64 boxes onto
//    the stage's mbarrier), else by cp.async from each row's address. TMA took the per-row address
//    chains off the copy path: on an H100, q_proj at 8192 rows 545 -> 600 TFLOP/s, the expert down
//    projection 363 -> 393, the 12-layer 8K prompt 238 -> 228 ms (docs/gpu-backend-notes.md,
//    "Session 31");
//  - each thread reads its two weight rows' bytes with 16-byte loads, picks those of its A
//    fragments (rows g and g + 8 of its warp's 16, elements 2t, 2t + 1 of every 8) with byte
//    permutes and expands them to bf16 pairs, for the next step while the tensor cores run this
//    one (two register sets of fragments);
//  - the group / block scales come from global memory two steps ahead, into registers.
// A dense launch of few 128-feature tiles (decode batches of 33-256 rows; up to 64 rows on the
// 64-row size) splits K over a cluster of 2-8 CTAs, which add their sums through distributed
// shared memory in rank order (wgmma_k_splits).
// The weights cross shared memory once, compressed, and an x tile serves 128 weight rows. Every
// wgmma wait is a full one (wgmma.wait_group 0): a partial wait makes ptxas serialise the MMAs.
// The fp32 sums leave through shared memory: whole output rows by consecutive lanes, and the
// SwiGLU's per-element code in a loop (unrolled over a thread's 64 outputs it made the kernel 20%
// slower, by instruction-cache misses). A version with a producer warpgroup (mbarrier ring,
// setmaxnreg 40 / 232) measured 22% slower on an H100 (docs/gpu-backend-notes.md, "Session 29").
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/mbarrier.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;  // weight rows (MMA M) per CTA: 2 warpgroups x 64
constexpr int kStepK = 64;      // K elements per step: one 128-byte swizzle row of x
constexpr int kStages = 4;

// The most rows (MMA N) an item of the kernel may have: 256 (kWgmmaItemRows), or 64 for the
// grouped launches' small items. Why a 64-row size: the K step's chain of waits costs about as
// much at N = 64 as at N = 256, and the 256 size holds an SM alone (200-240 registers, ~160 KB
// of shared memory), so an expert of a few dozen rows kept a whole SM for nearly a full item's
// time. The 64 size fits two CTAs an SM (at most 128 registers, no spills: `-Xptxas -v`; ~60 KB
// of shared memory for nvfp4), so two such chains overlap. At a 128-row maximum ptxas spills.
//
// The 320-row size (kWgmmaWideItemRows; grouped lists of NVFP4 weights: wgmma_max_item_rows)
// takes N = 320 as two MMAs a k16 step, N = 256 and N = 64 on the same A
// fragments. An 8,192-token prefill chunk gives M3.1's 128 experts 256 rows on average, so with
// 256-row items about half of them needed a second item of a few dozen rows, which expands the
// whole expert weight again (docs/gpu-backend-notes.md, "Session 39": 1.87 of a layer's 9.9 ms of
// routed GEMMs); the K step's chain (~2,000 cycles against ~1,100 of MMAs at N = 256) leaves room
// for the 64 more columns. mxfp8's SwiGLU spills at 320 and bf16's stages do not fit in shared
// memory, so those keep 256; dense launches keep 256 too, as 320-row items ran 6-29% slower there.
template <int kMaxN>
struct TileSize {
  static_assert(kMaxN == 64 || kMaxN == kWgmmaItemRows || kMaxN == kWgmmaWideItemRows, "an item size");
  static constexpr int kXTileBytes = kMaxN * kStepK * 2;
  // The x rows a thread copies: rows x_row + 32 i (i < N / 32) for x_row = tid / 8, each time the
  // same 16-byte column x_chunk = tid % 8 of the step's 64 elements.
  static constexpr int kXRowsPerThread = kMaxN / 32;
  static constexpr int kMinCtasPerSm = kMaxN == 64 ? 2 : 1;
};

// Shared memory beyond the stages: the tile's x row addresses, read when a stage is issued instead
// of held in registers (the accumulators take most of them). A thread's rows are contiguous
// (x_src[x_row * kXRowsPerThread + i]: token row x_row + 32 i), so it loads them two at a time and
// all its copies' address chains start together; loaded one row at a time, each copy waited for
// its own shared load, the largest share of the warps' stalls in `ncu` (docs/gpu-backend-notes.md,
// "Session 30").
template <int kMaxN>
struct TileShared {
  // kTmaX: the x tile of stage s has landed when barrier s completes its phase.
  alignas(16) uint64_t x_full[kStages];
  // The row's address in x, or a.x + 1 past the item's rows (odd: never a row; a.x stays mapped
  // for the zero-filling copy).
  alignas(16) uint64_t x_src[kMaxN];
  const uint8_t* weight_row[kTileRows];  // weight row of tile row m, null past n
};

// One weight row's bytes per K step in shared memory: kBytes of it, kPitch apart (the 8 rows a
// warp reads at once land in distinct banks), copied as kChunks 16-byte pieces of kChunkElems
// elements each.
template <WeightKind F, int kMaxN>
struct RawLayout {
  static constexpr int kBytes = F == WeightKind::kNvfp4 ? 32 : F == WeightKind::kBF16 ? 128 : 64;
  static constexpr int kPitch = kBytes + 16;
  static constexpr int kChunks = kBytes / 16;
  static constexpr int kChunkElems = kStepK / kChunks;
  static constexpr int kXTileBytes = TileSize<kMaxN>::kXTileBytes;
  // x tiles start on a 1024-byte swizzle pattern boundary.
  static constexpr int kStageBytes = (kXTileBytes + kTileRows * kPitch + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024 + int(sizeof(TileShared<kMaxN>));
};

// Where one CTA's features go: the launch's weight, or under segments (LinearArgs::seg, the fused
// attention projections) the segment's.
struct OutView {
  int n;  // output features
  uint16_t* out;
  int64_t stride;
};

// The K steps of 64 one CTA sums: all of them, or under split-K (a dense launch with too few
// 128-feature tiles to fill the GPU, wgmma_k_splits) the rank's share of a cluster's; `splits`
// CTAs of one cluster then add their sums in rank order (deterministic) before the epilogue.
struct KRange {
  int begin, count;  // global first step, steps
  int splits, rank;
};

// Which items of a launch a kernel instance computes. A grouped launch of large items runs
// twice over one item list: the 256 or 320 size takes the items of more than 64 rows, the 64 size the
// rest (the experts' tails); every CTA reads its item and returns when it belongs to the other.
enum class ItemSizes : int { kAll, kAbove64, kUpTo64 };

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t swizzled_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// D (+)= A B^T of one k16 step over an item's N token rows, B from the x tile at x_addr: one MMA up
// to N = 256 (wgmma's widest), else N = 256 and then N - 256 on the same A fragments (rows from 256
// on start 256 * 128 bytes further into the tile, a swizzle pattern boundary; their sums are
// d[128 ..], where the epilogue's layout continues).
template <int N>
__device__ __forceinline__ void wgmma_rows(float* d, const uint32_t (&a)[4], uint32_t x_addr) {
  if constexpr (N <= 256) {
    wgmma_bf16<N>(d, a, swizzled_desc(x_addr), true);
  } else {
    wgmma_bf16<256>(d, a, swizzled_desc(x_addr), true);
    wgmma_bf16<N - 256>(d + 128, a, swizzled_desc(x_addr + 256 * 128), true);
  }
}

// The weight and feature of tile row m: kStore rows are features n0 + m; kSwiglu rows 16 i + h * 8 + g
// are the gate (h 0) or up (h 1) row of feature n0 + 8 i + g.
template <bool kSwiglu>
__device__ __forceinline__ void tile_row_source(int m, int n0, int& j, int& feature) {
  if constexpr (kSwiglu) {
    j = (m >> 3) & 1;
    feature = n0 + ((m >> 4) << 3) + (m & 7);
  } else {
    j = 0;
    feature = n0 + m;
  }
}

// The scale bits of K step kt of one weight row: nvfp4 the 4 group scales (byte i: group 4 kt + i),
// mxfp8 the 2 block scales; 0 for groups past k (their codes are zero) and for absent rows.
// `whole`: the row's scale bytes may be read as one aligned word.
template <WeightKind F>
__device__ __forceinline__ uint32_t step_scales(const uint8_t* row, int kt, int k, bool whole) {
  constexpr int kGroups = F == WeightKind::kNvfp4 ? 4 : F == WeightKind::kMxfp8 ? 2 : 0;
  if constexpr (kGroups == 0) {
    return 0u;
  } else {
    constexpr int kGroupElems = kStepK / kGroups;
    if (row == nullptr) return 0u;
    const int g0 = kGroups * kt;
    if (whole && (g0 + kGroups) * kGroupElems <= k) {
      if constexpr (kGroups == 4) return __ldg(reinterpret_cast<const uint32_t*>(row + g0));
      else return __ldg(reinterpret_cast<const uint16_t*>(row + g0));
    }
    uint32_t v = 0u;
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
      if ((g0 + i) * kGroupElems < k) v |= uint32_t(__ldg(row + g0 + i)) << (8 * i);
    return v;
  }
}

// Thread t's byte selectors (prmt) for expand_row: nvfp4 byte t of a word, both nibbles with their
// signs replicated (decode_sub_fast's 0xC480 for byte 0); fp8 bytes 2t, 2t + 1 of an 8-byte chunk
// with signs (fast path) and without (the float path).
struct RowSelectors {
  uint32_t nvfp4, fp8_signed, fp8_plain;
  __device__ explicit RowSelectors(int t)
      : nvfp4(0xC480u + 0x1111u * t),
        fp8_signed((2u * t) | (8u | 2u * t) << 4 | (2u * t + 1u) << 8 | (8u | (2u * t + 1u)) << 12),
        fp8_plain((2u * t) | (2u * t + 1u) << 4) {}
};

// Thread t's 8 bf16 pairs of one weight row for one K step: pair c holds elements 8c + 2t, 8c + 2t + 1
// (nvfp4: times 2^-kNvfp4AccShift, decode_sub_fast's factor). `raw` is the row in the stage; nvfp4
// and fp8 rows are read whole with 16-byte loads (the four lanes of a quad read the same bytes: one
// broadcast), bf16 rows as the thread's own words.
// kFast: fp8 / mxfp8 bytes through decode_sub_fast's integer path (mxfp8 block exponents up to
// kMxfp8FastMaxExp), else through the float conversion; nvfp4 and bf16 have one path.
template <WeightKind F, bool kFast>
__device__ __forceinline__ void expand_row(const uint8_t* raw, int t, const RowSelectors& sel, uint32_t scales,
                                           uint32_t (&p)[8]) {
  if constexpr (F == WeightKind::kNvfp4) {
    // Word c holds elements 8c..8c+7, byte t of it elements 8c + 2t (low nibble) and 8c + 2t + 1:
    // [sx(n1) (n1 n0) sx(n0) (n0 x)] << 2 puts each magnitude at bf16 bits 6-8, each sign at bit 15.
    const uint4 q0 = *reinterpret_cast<const uint4*>(raw), q1 = *reinterpret_cast<const uint4*>(raw + 16);
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const FastScale lo = fast_scale_of<F>(scales & 0xFFFFu), hi = fast_scale_of<F>(scales >> 16);
    const uint32_t group[4] = {lo.pair[0], lo.pair[1], hi.pair[0], hi.pair[1]};
#pragma unroll
    for (int c = 0; c < 8; ++c)
      p[c] = hmul2_bits((prmt_reg(w[c] << 4, w[c], sel.nvfp4) << 2) & 0x81C081C0u, group[c >> 1]);
  } else if constexpr (F == WeightKind::kFp8 || F == WeightKind::kMxfp8) {
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 q = *reinterpret_cast<const uint4*>(raw + 16 * i);
      w[4 * i] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
    }
    if constexpr (kFast) {
      // Bytes b0 b1 -> [sx(b1) b1 sx(b0) b0] << 4, masked: bf16 bits of v * 2^-120, times 2^(S - 7).
      uint32_t mul[2] = {mx_fast_pair(127u), mx_fast_pair(127u)};
      if constexpr (F == WeightKind::kMxfp8) mul[0] = mx_fast_pair(scales & 0xFFu), mul[1] = mx_fast_pair(scales >> 8);
#pragma unroll
      for (int c = 0; c < 8; ++c)
        p[c] = hmul2_bits((prmt_reg(w[2 * c], w[2 * c + 1], sel.fp8_signed) << 4) & 0x87F087F0u, mul[c >> 2]);
    } else {
      float mul[2] = {1.0f, 1.0f};
      if constexpr (F == WeightKind::kMxfp8) {
        mul[0] = ue8m0_decode(uint8_t(scales));
        mul[1] = ue8m0_decode(uint8_t(scales >> 8));
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) p[c] = e4m3x2_to_bf16x2(__byte_perm(w[2 * c], w[2 * c + 1], sel.fp8_plain), mul[c >> 2]);
    }
  } else {
#pragma unroll
    for (int c = 0; c < 8; ++c) p[c] = *reinterpret_cast<const uint32_t*>(raw + 16 * c + 4 * t);
  }
}

// One CTA's tile: the MMAs over K and the epilogue, for N token columns. kTmaX: the x tiles come
// by TMA (x_map: x's rows, contiguous, in boxes of 64 elements x 64 rows, 128-byte swizzle: the
// layout of the cp.async path), one thread issuing N / 64 boxes a step onto the stage's barrier.
template <WeightKind F, bool kSwiglu, bool kTmaX, int kMaxN, int N>
__device__ __forceinline__ void run_tile(const LinearArgs& a, const CUtensorMap* x_map, const LinearItem& item,
                                         const WeightView& w0, const WeightView& w1, uint8_t* smem,
                                         const OutView& o, uint32_t smem_base, TileShared<kMaxN>& ts, int n0,
                                         const KRange& kr) {
  // kt below counts this CTA's steps (stage slots, barrier phases); kr.begin + kt is the global step.
  const int k_tiles = kr.count;
  static_assert(N <= kMaxN, "an item's rows fit the instance");
  using L = RawLayout<F, kMaxN>;
  constexpr int kXRowsPerThread = TileSize<kMaxN>::kXRowsPerThread;
  constexpr int kXTileBytes = L::kXTileBytes;
  constexpr int NW = kSwiglu ? 2 : 1;
  constexpr int kRawPerThread = kTileRows * L::kChunks / kThreads;
  const int tid = threadIdx.x, lane = tid & 31, t = tid & 3;
  const int m0 = 64 * (tid >> 7) + 16 * ((tid >> 5) & 3) + (lane >> 2);  // A rows m0 and m0 + 8
  const RowSelectors sel(t);

  const uint8_t* scale_row[2];
  bool scale_whole[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int j, f;
    tile_row_source<kSwiglu>(m0 + 8 * h, n0, j, f);
    const WeightView& wj = j == 0 ? w0 : w1;
    scale_row[h] = f < o.n && wj.scale != nullptr ? wj.scale + int64_t(f) * wj.scale_stride : nullptr;
    const int align = F == WeightKind::kNvfp4 ? 4 : 2;
    scale_whole[h] = wj.scale_stride % align == 0 && reinterpret_cast<uintptr_t>(wj.scale) % align == 0;
  }
  const int x_chunk = tid & 7, x_row = tid >> 3;
  const uint64_t* const x_src = ts.x_src + x_row * kXRowsPerThread;
  // This thread's weight rows for the raw copies (chunk ch of row m), fixed for the tile.
  const uint8_t* raw_row[kRawPerThread];
#pragma unroll
  for (int i = 0; i < kRawPerThread; ++i) raw_row[i] = ts.weight_row[(tid + i * kThreads) / L::kChunks];

  auto issue_stage = [&](int kt) {
    if (kt < k_tiles) {
      const uint32_t base = smem_base + (kt % kStages) * L::kStageBytes;
      if constexpr (kTmaX) {
        if (tid == 0) {
          uint64_t* bar = &ts.x_full[kt % kStages];
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar_addr(bar)),
                       "r"(N * kStepK * 2)
                       : "memory");
#pragma unroll
          for (int j = 0; j < N / 64; ++j)
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                    base + j * 64 * 128),
                "l"(reinterpret_cast<uint64_t>(x_map)), "r"((kr.begin + kt) * kStepK), "r"(item.row_begin + 64 * j), "r"(mbar_addr(bar))
                : "memory");
        }
      }
      const int kx = (kr.begin + kt) * kStepK + x_chunk * 8;
      const bool k_valid = kx < a.k;
#pragma unroll
      for (int i = 0; i < (kTmaX ? 0 : N / 32); i += 2) {
        const ulonglong2 pair = *reinterpret_cast<const ulonglong2*>(x_src + i);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint64_t src = j == 0 ? pair.x : pair.y;
          const bool valid = k_valid && (src & 1u) == 0;
          cp_async16_or_zero(base + swizzled(x_row + 32 * (i + j), x_chunk),
                             reinterpret_cast<const void*>(valid ? src + 2u * kx : src & ~uint64_t(1)), valid);
        }
      }
#pragma unroll
      for (int i = 0; i < kRawPerThread; ++i) {
        const int id = tid + i * kThreads, m = id / L::kChunks, ch = id % L::kChunks;
        const bool valid = raw_row[i] != nullptr && (kr.begin + kt) * kStepK + ch * L::kChunkElems < a.k;
        cp_async16_or_zero(base + kXTileBytes + m * L::kPitch + ch * 16,
                           valid ? static_cast<const void*>(raw_row[i] + int64_t(kr.begin + kt) * L::kBytes + ch * 16)
                                 : static_cast<const void*>(a.x),
                           valid);
      }
    }
    cp_async_commit();
  };

  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  uint32_t frag[2][4][4];  // [register set][k16 step][A fragment]
  auto expand_step = [&](auto set, int kt, const uint32_t (&scales)[2]) {
    constexpr int S = decltype(set)::value;
    const uint8_t* raw = smem + (kt % kStages) * L::kStageBytes + kXTileBytes;
    uint32_t p0[8], p1[8];
    bool fast = true;
    if constexpr (F == WeightKind::kMxfp8) {
      const uint32_t top = max(max(scales[0] & 0xFFu, scales[0] >> 8), max(scales[1] & 0xFFu, scales[1] >> 8));
      fast = !__any_sync(0xFFFFFFFFu, top > kMxfp8FastMaxExp);
    }
    if (fast) {
      expand_row<F, true>(raw + m0 * L::kPitch, t, sel, scales[0], p0);
      expand_row<F, true>(raw + (m0 + 8) * L::kPitch, t, sel, scales[1], p1);
    } else {
      expand_row<F, false>(raw + m0 * L::kPitch, t, sel, scales[0], p0);
      expand_row<F, false>(raw + (m0 + 8) * L::kPitch, t, sel, scales[1], p1);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      frag[S][s][0] = p0[2 * s];
      frag[S][s][1] = p1[2 * s];
      frag[S][s][2] = p0[2 * s + 1];
      frag[S][s][3] = p1[2 * s + 1];
    }
  };
  auto load_scales = [&](int kt, uint32_t (&s)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) s[h] = kt < k_tiles ? step_scales<F>(scale_row[h], kr.begin + kt, a.k, scale_whole[h]) : 0u;
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_stage(s);
  uint32_t sc_next[2], sc_after[2];
  load_scales(0, sc_next);
  load_scales(1, sc_after);
  cp_async_wait<kStages - 2>();
  if constexpr (!kTmaX) fence_async_shared();
  __syncthreads();
  expand_step(std::integral_constant<int, 0>(), 0, sc_next);

  // Step kt: the MMAs of step kt from register set S, then (under them) stage kt + 1 waited for,
  // stage kt + kStages - 1 issued into the slot step kt - 1 used (both warpgroups finished its
  // MMAs before this step's barrier), step kt + 1's fragments expanded into the other set.
  // The proxy fence orders x rows copied by cp.async (the generic proxy) before the MMAs read
  // them (the async proxy). x tiles that come by TMA are async-proxy writes whose mbarrier
  // completion the MMAs wait on, so there is nothing to fence: without it an 8,192-row o_proj
  // took 4.5% less time and the 8K prompt 1.5% less (H100, docs/gpu-backend-notes.md "Session
  // 47"). The scale loads stay before the barrier: loaded after it (the fence dropped too), the
  // routed experts' GEMMs at 2,048 tokens were 12% slower.
  auto step = [&](auto set, int kt) {
    constexpr int S = decltype(set)::value;
    const uint32_t x_tile = smem_base + (kt % kStages) * L::kStageBytes;
    if constexpr (kTmaX) mbar_wait(&ts.x_full[kt % kStages], (kt / kStages) & 1);
    wgmma_pin<N>(d);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_rows<N>(d, frag[S][s], x_tile + 32 * s);
    wgmma_commit();
    sc_next[0] = sc_after[0];
    sc_next[1] = sc_after[1];
    load_scales(kt + 2, sc_after);
    cp_async_wait<kStages - 3>();
    if constexpr (!kTmaX) fence_async_shared();
    __syncthreads();
    issue_stage(kt + kStages - 1);
    if (kt + 1 < k_tiles) expand_step(std::integral_constant<int, 1 - S>(), kt + 1, sc_next);
    wgmma_wait_all();
    wgmma_pin<N>(d);
  };
  for (int kt = 0; kt < k_tiles; kt += 2) {
    step(std::integral_constant<int, 0>(), kt);
    if (kt + 1 < k_tiles) step(std::integral_constant<int, 1>(), kt + 1);
  }
  // The epilogue goes through shared memory (the stages are free once every warp has waited for
  // its MMAs): the sums by token row, then each output row written by consecutive lanes, and the
  // SwiGLU's per-element code in a loop rather than unrolled over a thread's 64 outputs.
  cp_async_wait<0>();
  __syncthreads();
  constexpr int kPitch = kTileRows + 4;  // floats; a warp's stores below hit 32 distinct banks
  static_assert(N * kPitch * 4 <= kStages * L::kStageBytes, "epilogue tile");
  float* sums = reinterpret_cast<float*>(smem);
  // d[4 j + 2 h + c]: tile row m0 + 8 h, token 8 j + 2 t + c.
#pragma unroll
  for (int jj = 0; jj < N / 8; ++jj)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) sums[(8 * jj + 2 * t + c) * kPitch + m0 + 8 * h] = d[4 * jj + 2 * h + c];
  // Split-K: every CTA of the cluster holds its partial sums; rank r finishes outputs r, r + splits,
  // ... (in blocks of kThreads), adding the ranks' sums in rank order.
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (kr.splits > 1) cluster.sync();
  else __syncthreads();
  const float acc_mul = F == WeightKind::kNvfp4 ? float(1 << kNvfp4AccShift) : 1.0f;
  const OutScale os[2] = {OutScale::of(w0), kSwiglu ? OutScale::of(w1) : OutScale()};
  const int rows = item.row_count;
  constexpr int kFeatures = kSwiglu ? kTileRows / 2 : kTileRows;
  if (kr.splits == 1) {
    for (int i = tid; i < rows * kFeatures; i += kThreads) {
      const int tok = i / kFeatures, fl = i % kFeatures, f = n0 + fl;
      if (f >= o.n) continue;
      // tile_row_source's rows: kStore feature fl; kSwiglu its gate row m (up is 8 further).
      const int m = kSwiglu ? 16 * (fl >> 3) + (fl & 7) : fl;
      float v[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) v[j] = sums[tok * kPitch + m + 8 * j] * acc_mul;
      o.out[int64_t(item.row_begin + tok) * o.stride + f] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, os, v));
    }
  } else {
    // A thread takes 4 consecutive features of a token (rows m .. m + 3 of the sums: 16-byte loads
    // from every rank's shared memory, all issued before the adds), added in rank order: rank 0's
    // sums, then rank 1's, ..., the same order whichever rank adds. One feature at a time, each add
    // waited on its remote load in turn: 15% of the stall samples of a 128-row launch of three
    // splits under ncu (docs/gpu-backend-notes.md, "Session 37").
    constexpr int kQuads = kFeatures / 4;
    for (int i = tid + kr.rank * kThreads; i < rows * kQuads; i += kThreads * kr.splits) {
      const int tok = i / kQuads, fl = 4 * (i % kQuads);
      if (n0 + fl >= o.n) continue;
      const int m = kSwiglu ? 16 * (fl >> 3) + (fl & 7) : fl;
      float4 part[kWgmmaMaxKSplits][NW];
#pragma unroll
      for (int r = 0; r < kWgmmaMaxKSplits; ++r)
        if (r < kr.splits) {
          const float* peer = cluster.map_shared_rank(sums, r);
#pragma unroll
          for (int j = 0; j < NW; ++j) part[r][j] = *reinterpret_cast<const float4*>(peer + tok * kPitch + m + 8 * j);
        }
#pragma unroll
      for (int r = 1; r < kWgmmaMaxKSplits; ++r)
        if (r < kr.splits)
#pragma unroll
          for (int j = 0; j < NW; ++j) {
            part[0][j].x += part[r][j].x;
            part[0][j].y += part[r][j].y;
            part[0][j].z += part[r][j].z;
            part[0][j].w += part[r][j].w;
          }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int f = n0 + fl + c;
        if (f >= o.n) break;
        float v[NW];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          const float4& q = part[0][j];
          v[j] = (c == 0 ? q.x : c == 1 ? q.y : c == 2 ? q.z : q.w) * acc_mul;
        }
        o.out[int64_t(item.row_begin + tok) * o.stride + f] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, os, v));
      }
    }
  }
  if (kr.splits > 1) cluster.sync();  // the peers' sums stay until every rank has read them
}

template <WeightKind F, bool kSwiglu, bool kTmaX, int kMaxN>
__global__ void __launch_bounds__(kThreads, TileSize<kMaxN>::kMinCtasPerSm)
    wgmma_linear_kernel(const LinearArgs a, const __grid_constant__ CUtensorMap x_map, const ItemSizes sizes) {
  kernel_prologue();
  using L = RawLayout<F, kMaxN>;
  constexpr int kXRowsPerThread = TileSize<kMaxN>::kXRowsPerThread;
  extern __shared__ uint8_t smem_raw[];
  const ItemInfo info = item_of(a, blockIdx.y);
  if (!info.valid) return;
  const LinearItem item = info.item;
  if ((sizes == ItemSizes::kAbove64 && item.row_count <= 64) || (sizes == ItemSizes::kUpTo64 && item.row_count > 64) ||
      item.row_count <= a.streamed_items_up_to)  // the streamed kernel's (linear.cu launch_mma)
    return;

  const uint32_t smem_base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (smem_base - smem_u32(smem_raw));
  TileShared<kMaxN>& ts = *reinterpret_cast<TileShared<kMaxN>*>(smem + kStages * L::kStageBytes);
  const int tid = threadIdx.x;
  const int k_tiles = (a.k + kStepK - 1) / kStepK;
  // Split-K: the cluster's CTAs (along z) share the K steps out evenly, the first ones one more.
  KRange kr{0, k_tiles, int(gridDim.z), int(blockIdx.z)};
  if (kr.splits > 1) {
    const int per = k_tiles / kr.splits, extra = k_tiles % kr.splits;
    kr.begin = kr.rank * per + min(kr.rank, extra);
    kr.count = per + (kr.rank < extra ? 1 : 0);
  }
  int tile = blockIdx.x;
  WeightView w0;
  OutView o;
  if (a.num_segments > 0) {  // several weights in one launch (kStore): this tile's
    const int s = segment_of_tile(a, tile);
    tile -= a.seg[s].tile_begin;
    w0 = a.seg[s].w;
    o = {a.seg[s].n, a.seg[s].out, a.seg[s].out_stride};
  } else {
    w0 = weight_of(a, 0, item.expert);
    o = {a.n, a.out, a.out_stride};
  }
  const WeightView w1 = kSwiglu ? weight_of(a, 1, item.expert) : w0;
  const int n0 = tile * (kSwiglu ? kTileRows / 2 : kTileRows);

  if constexpr (kTmaX) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(&ts.x_full[s], 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the TMA unit
    }
  } else {
    for (int r = tid; r < kMaxN; r += kThreads)
      ts.x_src[(r % 32) * kXRowsPerThread + r / 32] =
          r < item.row_count ? reinterpret_cast<uint64_t>(a.x + src_row(a, item.row_begin + r) * a.x_stride)
                             : reinterpret_cast<uint64_t>(a.x) + 1u;
  }
  if (tid < kTileRows) {
    int j, f;
    tile_row_source<kSwiglu>(tid, n0, j, f);
    const WeightView& wj = j == 0 ? w0 : w1;
    ts.weight_row[tid] = f < o.n ? wj.data + int64_t(f) * wj.row_bytes : nullptr;
  }
  __syncthreads();

  // N: the item's rows rounded up to 64 (the same choice in every warp of the CTA).
  const int rows = item.row_count;
  if constexpr (kMaxN == 64) {
    run_tile<F, kSwiglu, kTmaX, 64, 64>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
  } else {
    if (rows <= 64) run_tile<F, kSwiglu, kTmaX, kMaxN, 64>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
    else if (rows <= 128)
      run_tile<F, kSwiglu, kTmaX, kMaxN, 128>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
    else if (rows <= 192)
      run_tile<F, kSwiglu, kTmaX, kMaxN, 192>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
    else if (kMaxN == kWgmmaItemRows || rows <= kWgmmaItemRows)
      run_tile<F, kSwiglu, kTmaX, kMaxN, kWgmmaItemRows>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
    else run_tile<F, kSwiglu, kTmaX, kMaxN, kMaxN>(a, &x_map, item, w0, w1, smem, o, smem_base, ts, n0, kr);
  }
}

// The driver's tensor-map encoder, looked up once (an immutable driver symbol).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// x's tensor map for the kTmaX kernels when x's rows are contiguous (no row map, rows
// of whole 16-byte chunks): [a.rows][a.k] bf16 with row stride x_stride, boxes of 64 x 64 elements in
// the 128-byte swizzle; rows and columns past x read as zeros. False: the cp.async path.
bool encode_x_map(const LinearArgs& a, CUtensorMap* map) {
  if (a.x_rows != nullptr || a.rows <= 0 || a.x_stride < a.k ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || (a.x_stride * 2) % 16 != 0)
    return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {cuuint64_t(a.k), cuuint64_t(a.rows)};
  const cuuint64_t strides[1] = {cuuint64_t(a.x_stride) * 2};
  const cuuint32_t box[2] = {kStepK, 64};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(a.x), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

int wgmma_split_count(int64_t ctas, int k_tiles, const int* fit, int counts) {
  int best = 1;
  int64_t best_time = INT64_MAX;
  for (int s = 1; s <= counts && s <= kWgmmaMaxKSplits && (s == 1 || k_tiles >= kWgmmaMinSplitSteps * s); ++s) {
    if (fit[s - 1] <= 0) break;
    const int64_t time = (ctas + fit[s - 1] - 1) / fit[s - 1] * ((k_tiles + s - 1) / s + kWgmmaSplitFixedSteps);
    if (time < best_time) best = s, best_time = time;
  }
  return best;
}

namespace {

// The clusters of s CTAs (s = 1 .. kWgmmaMaxKSplits) of one kernel instance that fit at once on a
// device: a fixed property of the instance and the GPU, asked of the runtime once per device and
// kept (0: not asked yet, -1: the query failed), so that an eager launch does not repeat up to 8
// occupancy queries. Devices past kFitDevices are asked at every launch.
constexpr int kFitDevices = 16;
using ClusterFits = std::atomic<int>[kFitDevices][kWgmmaMaxKSplits];

template <class Kernel>
int clusters_that_fit(Kernel kernel, int smem, int device, int s, ClusterFits& cache) {
  std::atomic<int>* slot = device < kFitDevices ? &cache[device][s - 1] : nullptr;
  if (slot != nullptr) {
    const int known = slot->load(std::memory_order_relaxed);
    if (known != 0) return known;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, 1, s);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = unsigned(s);
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  int fit = 0;
  if (cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg) != cudaSuccess || fit <= 0) {
    (void)cudaGetLastError();  // the query's error must not stay for the launch's check
    fit = -1;
  }
  if (slot != nullptr) slot->store(fit, std::memory_order_relaxed);
  return fit;
}

// The split count of a dense launch (wgmma_split_count's model); a.k_splits > 0 (the split-K sweep
// of `backend_check bench`) forces one. Grouped launches (experts) have CTAs enough and never split.
template <class Kernel>
int wgmma_k_splits(const LinearArgs& a, dim3 grid, Kernel kernel, int smem, ClusterFits& cache) {
  const int k_tiles = (a.k + kStepK - 1) / kStepK;
  if (a.items != nullptr) return 1;
  if (a.k_splits > 0) return std::max(1, std::min({a.k_splits, kWgmmaMaxKSplits, k_tiles}));
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  const int64_t ctas = int64_t(grid.x) * grid.y;
  if (ctas >= sms) return 1;
  int fit[kWgmmaMaxKSplits];
  int counts = 0;
  while (counts < kWgmmaMaxKSplits && (counts == 0 || k_tiles >= kWgmmaMinSplitSteps * (counts + 1))) {
    fit[counts] = clusters_that_fit(kernel, smem, device, counts + 1, cache);
    if (fit[counts] <= 0) break;
    ++counts;
  }
  return wgmma_split_count(ctas, k_tiles, fit, counts);
}

// Split-K where wgmma_k_splits gives more than one: grid.z splits, one cluster of them along z per tile.
template <WeightKind F, bool kSwiglu, int kMaxN>
void launch_size(const LinearArgs& a, const CUtensorMap& x_map, bool tma, dim3 grid, ItemSizes sizes,
                 cudaStream_t stream) {
  constexpr int smem = RawLayout<F, kMaxN>::kSmemBytes;
  const auto kernel = tma ? wgmma_linear_kernel<F, kSwiglu, true, kMaxN> : wgmma_linear_kernel<F, kSwiglu, false, kMaxN>;
  static ClusterFits fits[2];  // [tma]: the instance's cluster counts per device, asked once
  grid.z = wgmma_k_splits(a, grid, kernel, smem, fits[tma ? 1 : 0]);
  launch_cluster_kernel(kernel, grid, kThreads, dim3(1, 1, grid.z), smem, stream, a, x_map, sizes);
}

// Whether the kernel has an instance of items of up to kMaxN rows for weight kind F.
template <WeightKind F, int kMaxN>
constexpr bool kSizeExists = kMaxN <= wgmma_max_item_rows(F);

// Items of more than 64 rows on the kMaxN size: a dense launch's all, a grouped list's those of
// more than 64 rows, the rest (the experts' tails) on the 64-row size.
template <WeightKind F, bool kSwiglu, int kMaxN>
void launch_large(const LinearArgs& a, const CUtensorMap& x_map, bool tma, dim3 grid, cudaStream_t stream) {
  if (a.items == nullptr) {
    launch_size<F, kSwiglu, kMaxN>(a, x_map, tma, grid, ItemSizes::kAll, stream);
  } else {
    launch_size<F, kSwiglu, kMaxN>(a, x_map, tma, grid, ItemSizes::kAbove64, stream);
    launch_size<F, kSwiglu, 64>(a, x_map, tma, grid, ItemSizes::kUpTo64, stream);
  }
}

template <WeightKind F, bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int items, cudaStream_t stream) {
  constexpr int features = kSwiglu ? kTileRows / 2 : kTileRows;
  static_assert(kTileRows == kWgmmaTileFeatures, "the segments' tile_begin counts these tiles");
  int tiles = (a.n + features - 1) / features;
  if (a.num_segments > 0) {
    const LinearSegment& last = a.seg[a.num_segments - 1];
    tiles = last.tile_begin + (last.n + features - 1) / features;
  }
  const dim3 grid(tiles, items, 1);
  CUtensorMap x_map{};
  const bool tma = encode_x_map(a, &x_map);
  // A dense launch of up to 64 rows (linear_item_rows: wide layers at decode batches of 33-64)
  // runs the 64-row size, two CTAs an SM, with its K split (wgmma_k_splits).
  if (a.item_rows <= 64 || (a.items == nullptr && a.rows <= 64)) {
    launch_size<F, kSwiglu, 64>(a, x_map, tma, grid, ItemSizes::kAll, stream);
  } else if (a.item_rows <= kWgmmaItemRows) {
    launch_large<F, kSwiglu, kWgmmaItemRows>(a, x_map, tma, grid, stream);
  } else if constexpr (kSizeExists<F, kWgmmaWideItemRows>) {
    if (a.item_rows > kWgmmaWideItemRows) return cudaErrorInvalidValue;
    launch_large<F, kSwiglu, kWgmmaWideItemRows>(a, x_map, tma, grid, stream);
  } else {
    return cudaErrorInvalidValue;  // items wider than wgmma_max_item_rows
  }
  return cudaGetLastError();
}

template <bool kSwiglu>
cudaError_t launch_epilogue(const LinearArgs& a, int items, cudaStream_t stream) {
  return dispatch_mma_kind(a.w[0].kind, [&](auto kind) { return launch_kind<decltype(kind)::value, kSwiglu>(a, items, stream); });
}

template <WeightKind F, int kMaxN>
cudaError_t set_smem_limit() {
  if constexpr (kSizeExists<F, kMaxN>) {
    constexpr int bytes = RawLayout<F, kMaxN>::kSmemBytes;
    for (auto kernel : {wgmma_linear_kernel<F, false, false, kMaxN>, wgmma_linear_kernel<F, false, true, kMaxN>,
                        wgmma_linear_kernel<F, true, false, kMaxN>, wgmma_linear_kernel<F, true, true, kMaxN>}) {
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      // Two 64-row CTAs an SM need the carveout at its shared-memory maximum.
      if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

template <WeightKind F>
cudaError_t set_smem_limits() {
  cudaError_t e = set_smem_limit<F, 64>();
  if (e == cudaSuccess) e = set_smem_limit<F, kWgmmaItemRows>();
  return e != cudaSuccess ? e : set_smem_limit<F, kWgmmaWideItemRows>();
}

}  // namespace

cudaError_t init_linear_wgmma_kernels() {
  cudaError_t e;
  if ((e = set_smem_limits<WeightKind::kBF16>()) != cudaSuccess) return e;
  if ((e = set_smem_limits<WeightKind::kFp8>()) != cudaSuccess) return e;
  if ((e = set_smem_limits<WeightKind::kMxfp8>()) != cudaSuccess) return e;
  return set_smem_limits<WeightKind::kNvfp4>();
}

cudaError_t launch_linear_wgmma(const LinearArgs& a, int items, cudaStream_t stream) {
  return a.epilogue == Epilogue::kSwiglu ? launch_epilogue<true>(a, items, stream)
                                         : launch_epilogue<false>(a, items, stream);
}

}  // namespace m3::cuda::detail
