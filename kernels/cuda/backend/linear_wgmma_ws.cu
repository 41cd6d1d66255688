// Built with M3_CUDA_UNCHECKED=ON in place of linear_wgmma.cu (same interface), until a GPU run has
// checked and measured it (docs/gpu-backend-notes.md, "Session 25").
//
// Prefill-shaped linear layers (items of 128 rows) on Hopper's warpgroup MMA: y = x W^T with W
// expanded to bf16 into shared memory (never a dequantized copy in device memory), fp32
// accumulation in registers. Same numerics as the skinny and streamed kernels: exact bf16
// expansion of the weights, the second-level / per-tensor scale and the SwiGLU epilogue on the
// fp32 sum; only the fp32 summation order differs.
//
// Warp-specialised. A CTA (one per SM: 193 KB of shared memory) is three warpgroups over a tile of
// 128 x rows by 256 weight rows (256 features, or 128 gate + 128 up features for the fused SwiGLU,
// so that a thread holds a feature's gate and up sums together), in K steps of 64:
//  - the producer warpgroup stages each step's x rows by cp.async (gathered rows for MoE, zeros
//    past the item or K) and expands the step's weight chunks, loaded into registers two steps
//    ahead, into the bf16 B tile with the register-only decoders of weight_decode.cuh (bf16
//    weights are copied as they are); a ring of 4 stages signalled by mbarriers;
//  - two consumer warpgroups, 64 x rows each, issue 4 wgmma m64n256k16 a step from the stage's
//    tiles and keep one step's MMAs in flight (wait_group 1) while they wait for the next stage,
//    releasing each stage once its MMAs are done.
// So the tensor cores never wait for a weight expansion, which the two-warpgroup kernel before it
// did at every step (each warp loaded, expanded, then ran its MMAs: ~350 TFLOP/s;
// docs/gpu-backend-notes.md, "Prefill, session 4" and "Session 25").
//
// Tiles run in groups of kItemGroup items (each group's items side by side for every weight
// tile), so that a weight tile is read from DRAM about once per group rather than once per item.
//
// Both operands sit in shared memory in the 128-byte-swizzled K-major layout wgmma reads through
// matrix descriptors.
#include <cuda_bf16.h>

#include <climits>
#include <type_traits>
#include <utility>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/mbarrier.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kRowsM = kWgmmaItemRows;  // x rows per tile: 2 consumer warpgroups x 64
static_assert(kRowsM == 128, "two consumer warpgroups of 64 rows");
constexpr int kRowsB = 256;  // weight rows per tile (all weights together)
constexpr int kStepK = 64;   // K elements per step: one 128-byte swizzle row
constexpr int kStages = 4;
constexpr int kProducerThreads = 128;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = kProducerThreads + 32 * kConsumerWarps;
constexpr int kTileBytesA = kRowsM * kStepK * 2;
constexpr int kTileBytesB = kRowsB * kStepK * 2;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
constexpr int kItemGroup = 8;
// The swizzle pattern repeats every 1024 bytes and the descriptors assume tiles aligned to it:
// the dynamic allocation is over-sized by one pattern and aligned by hand; the barriers follow
// the stages.
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// 16 read-only bytes through L1: a run's second chunk finds the 32-byte sector its first brought
// in (load_stream16's no-allocate loads would fetch it from L2 twice).
__device__ __forceinline__ uint4 load_cached16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 16 bytes from src, or 16 zero bytes without a read when !valid (src must still be an address).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// d[64 x 256] += A[64 x 16] B[256 x 16]^T, both bf16 from shared memory, fp32 accumulators in
// the warpgroup's registers (thread layout of mma.sync m16n8 per 8 columns: d[4 j + 2 h + c] is
// row 16 warp + g + 8 h, column 8 j + 2 q + c).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// f(std::integral_constant<int, i>()) for i = 0 .. N - 1, unrolled: array indices and the values
// derived from them stay compile-time.
template <int N, class Fn, int... I>
__device__ __forceinline__ void unrolled_impl(Fn&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>()), ...);
}
template <int N, class Fn>
__device__ __forceinline__ void unrolled(Fn&& f) {
  unrolled_impl<N>(f, std::make_integer_sequence<int, N>());
}

// The producer warpgroup: every K step's x rows (cp.async) and weight rows (expanded to bf16, or
// copied for bf16 weights) into the stage ring. Thread t stages x chunk t % 8 of rows t / 8 + 16 i.
// Of the weights it takes runs of kRun consecutive 16-byte chunks (a whole 32-byte sector, one
// address and one mxfp8 scale byte a run) at the same place of kPasses B rows kRowStep apart.
template <WeightKind F, bool kSwiglu>
__device__ __forceinline__ void produce(const LinearArgs& a, const LinearItem& item, int n0, int k_tiles,
                                        uint32_t base, uint8_t* smem, uint64_t* full, uint64_t* empty) {
  using Fmt = WeightFmt<F>;
  constexpr int E = Fmt::kElems, NW = kSwiglu ? 2 : 1, BN = kRowsB / NW;
  constexpr bool kCopy = F == WeightKind::kBF16;  // no expansion: cp.async as x
  constexpr int kPerRow = kStepK / E;             // weight chunks per row and step
  constexpr int kRun = kCopy ? 1 : 2;
  constexpr int kRowStep = kProducerThreads * kRun / kPerRow;  // B rows a pass covers
  constexpr int kPasses = kRowsB / kRowStep;
  constexpr int kChunks = kPasses * kRun;  // weight chunks per thread and step
  // Scale bits per chunk (nvfp4: two E4M3 group scales) or per run (mxfp8: the run is one
  // 32-element block), packed into words: unpacked, two steps of 8 mxfp8 chunks leave the producer
  // short of registers.
  constexpr int kScaleBits = F == WeightKind::kNvfp4 ? 16 : F == WeightKind::kMxfp8 ? 8 : 0;
  constexpr int kScaleSlots = F == WeightKind::kNvfp4 ? kChunks : kPasses;
  constexpr int kScaleWords = kScaleBits == 0 ? 1 : (kScaleSlots * kScaleBits + 31) / 32;
  static_assert(F != WeightKind::kMxfp8 || kRun * E == 32, "an mxfp8 run is one scale block");
  static_assert(BN % kRowStep == 0, "a pass lies in one weight");
  const int tid = threadIdx.x;
  WeightView w[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);

  // x row of each of the thread's 8 chunks (-1: past the item, zeros).
  const int xc = tid % 8;
  int xrow[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = tid / 8 + 16 * i;
    xrow[i] = row < item.row_count ? int(src_row(a, item.row_begin + row)) : -1;
  }
  const int col = (tid % (kPerRow / kRun)) * kRun * E;  // the thread's run within a row's step
  const int row0 = tid / (kPerRow / kRun);             // its B row in pass 0
  // Weight j (compile-time: a WeightView indexed at run time would live in local memory) and
  // feature n of pass p (n >= a.n: past the weight, zeros).
  auto pass_row = [&](auto pc, int& n) {
    constexpr int p = decltype(pc)::value;
    n = n0 + (p * kRowStep) % BN + row0;
    return (p * kRowStep) / BN;
  };

  uint4 raw0[kCopy ? 1 : kChunks], raw1[kCopy ? 1 : kChunks];
  uint32_t sb0[kScaleWords], sb1[kScaleWords];
  // Step kt's weight chunks into registers (zeros past K or the weight: exact zero products).
  auto load = [&](int kt, auto& raw, auto& sb) {
    if constexpr (!kCopy) {
#pragma unroll
      for (int i = 0; i < kScaleWords; ++i) sb[i] = 0;
      unrolled<kPasses>([&](auto pc) {
        constexpr int p = decltype(pc)::value;
        int n;
        const WeightView& wj = w[pass_row(pc, n)];
        const int64_t k = int64_t(kt) * kStepK + col;
        const uint8_t* src = wj.data + int64_t(n) * wj.row_bytes + Fmt::byte_offset(k);
        [[maybe_unused]] const uint8_t* srow = wj.scale + int64_t(n) * wj.scale_stride;
#pragma unroll
        for (int r = 0; r < kRun; ++r) {
          const int i = p * kRun + r;
          if (n < a.n && k + r * E < a.k) {
            raw[i] = load_cached16(src + 16 * r);
            if constexpr (F == WeightKind::kNvfp4)
              sb[i * kScaleBits / 32] |= uint32_t(__ldg(reinterpret_cast<const uint16_t*>(srow + (k + r * E) / 16)))
                                         << (i * kScaleBits % 32);
          } else {
            raw[i] = make_uint4(0, 0, 0, 0);
          }
        }
        if constexpr (F == WeightKind::kMxfp8)
          if (n < a.n && k < a.k) sb[p * kScaleBits / 32] |= uint32_t(__ldg(srow + k / 32)) << (p * kScaleBits % 32);
      });
    }
  };
  // Chunk i's scale.
  auto scale_of = [&](int i, const auto& sb) {
    if constexpr (kScaleBits == 0) {
      return FastScale();
    } else {
      const int slot = F == WeightKind::kNvfp4 ? i : i / kRun;
      return fast_scale_of<F>((sb[slot * kScaleBits / 32] >> (slot * kScaleBits % 32)) & ((1u << kScaleBits) - 1));
    }
  };
  // One K step into stage kt % kStages: wait until the consumers released it, copy x (and bf16
  // weights), expand the weights loaded earlier, load those of step kt + 2, then announce step
  // kt - 1, whose copies have landed by now.
  auto step = [&](int kt, auto& raw, auto& sb) {
    const int s = kt % kStages;
    mbar_wait(&empty[s], ((kt / kStages) & 1) ^ 1u);
    const uint32_t a_tile = base + s * kStageBytes, b_tile = a_tile + kTileBytesA;
    const int k = kt * kStepK;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool valid = xrow[i] >= 0 && k + xc * 8 < a.k;
      const uint16_t* src = valid ? a.x + int64_t(xrow[i]) * a.x_stride + k + xc * 8 : a.x;
      cp_async16_zfill(a_tile + swizzled(tid / 8 + 16 * i, xc), src, valid);
    }
    unrolled<kPasses>([&](auto pc) {
      constexpr int p = decltype(pc)::value;
      int n;
      const WeightView& wj = w[pass_row(pc, n)];
      const int slot = row0 + p * kRowStep;
      if constexpr (kCopy) {
        const bool valid = n < a.n && k + col < a.k;
        const uint8_t* src = valid ? wj.data + int64_t(n) * wj.row_bytes + Fmt::byte_offset(k + col) : wj.data;
        cp_async16_zfill(b_tile + swizzled(slot, col / 8), src, valid);
      } else {
        uint8_t* dst = smem + (b_tile - base);
#pragma unroll
        for (int r = 0; r < kRun; ++r) {
          const int i = p * kRun + r;
          const FastScale sc = scale_of(i, sb);
          const int c8 = (col + r * E) / 8;  // the chunk's first 16-byte column of the B row
          bool exact = false;
          if constexpr (F == WeightKind::kMxfp8) exact = sc.pair[0] > mx_fast_pair(kMxfp8FastMaxExp);
          if (exact) {
#pragma unroll
            for (int sub = 0; sub < E / 8; ++sub)
              *reinterpret_cast<uint4*>(dst + swizzled(slot, c8 + sub)) = expand_sub<F, true>(raw[i], sub, sc);
          } else {
#pragma unroll
            for (int sub = 0; sub < E / 8; ++sub)
              *reinterpret_cast<uint4*>(dst + swizzled(slot, c8 + sub)) = expand_sub<F, false>(raw[i], sub, sc);
          }
        }
      }
    });
    cp_async_commit();
    if (kt + 2 < k_tiles) load(kt + 2, raw, sb);
    cp_async_wait<1>();
    fence_async_shared();
    if (kt > 0) mbar_arrive(&full[(kt - 1) % kStages]);
  };

  load(0, raw0, sb0);
  if (k_tiles > 1) load(1, raw1, sb1);
  for (int kt = 0; kt < k_tiles; kt += 2) {
    step(kt, raw0, sb0);
    if (kt + 1 < k_tiles) step(kt + 1, raw1, sb1);
  }
  cp_async_wait<0>();
  fence_async_shared();
  mbar_arrive(&full[(k_tiles - 1) % kStages]);
}

template <WeightKind F, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, 1) wgmma_linear_kernel(const LinearArgs a, int n_tiles, int items) {
  kernel_prologue();
  constexpr int NW = kSwiglu ? 2 : 1, BN = kRowsB / NW;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - smem_u32(smem_raw));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  // Tile blockIdx.x: groups of kItemGroup items (fewer in the last), every weight tile of a group
  // with its items side by side.
  const int per_group = kItemGroup * n_tiles;
  const int group = int(blockIdx.x) / per_group, in_group = int(blockIdx.x) % per_group;
  const int group_items = min(kItemGroup, items - group * kItemGroup);
  const ItemInfo info = item_of(a, group * kItemGroup + in_group % group_items);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int n0 = (in_group / group_items) * BN;
  const int k_tiles = (a.k + kStepK - 1) / kStepK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kProducerThreads);
      mbar_init(&empty[s], kConsumerWarps);
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < kProducerThreads) {
    produce<F, kSwiglu>(a, item, n0, k_tiles, base, smem, full, empty);
    return;
  }

  const int ct = int(threadIdx.x) - kProducerThreads, cw = ct >> 7, warp = (ct >> 5) & 3, lane = ct & 31;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  if (cw * 64 < item.row_count) {
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kStages;
      mbar_wait(&full[s], (kt / kStages) & 1);
      const uint32_t a_tile = base + s * kStageBytes + cw * (kTileBytesA / 2);
      const uint32_t b_tile = base + s * kStageBytes + kTileBytesA;
      wgmma_pin<256>(d);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kStepK / 16; ++ks)
        wgmma_m64n256k16(d, smem_desc(a_tile + ks * 32), smem_desc(b_tile + ks * 32));
      wgmma_commit();
      // The previous step's MMAs are done: its stage goes back to the producer.
      wgmma_wait<1>();
      wgmma_pin<256>(d);
      if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % kStages]);
    }
  } else {
    // All 64 rows of this warpgroup lie past the item (an expert's last item of at most 64
    // rows): no MMAs, which leaves the tensor cores to the other warpgroup; it still releases
    // every stage. (A branch inside the loop above would make ptxas serialise its MMAs.)
    for (int kt = 0; kt < k_tiles; ++kt) {
      mbar_wait(&full[kt % kStages], (kt / kStages) & 1);
      if (lane == 0) mbar_arrive(&empty[kt % kStages]);
    }
    return;
  }
  wgmma_wait<0>();
  wgmma_pin<256>(d);

  OutScale scale[2];
#pragma unroll
  for (int j = 0; j < NW; ++j) scale[j] = OutScale::of(weight_of(a, j, item.expert));
  // The nvfp4 decoder's products carry 2^-kNvfp4AccShift (weight_decode.cuh): exact to undo.
  const float shift = F == WeightKind::kNvfp4 ? float(1 << kNvfp4AccShift) : 1.0f;
  const bool pairs = a.out_stride % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % 4 == 0;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = cw * 64 + warp * 16 + g + 8 * h;
    if (row >= item.row_count) continue;
    uint16_t* o = a.out + int64_t(item.row_begin + row) * a.out_stride;
#pragma unroll
    for (int j = 0; j < 32 / NW; ++j) {
      const int col = n0 + j * 8 + 2 * q;
      if (col >= a.n) continue;
      uint16_t v2[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v[NW];
#pragma unroll
        for (int wi = 0; wi < NW; ++wi) v[wi] = d[4 * (j + wi * (32 / NW)) + 2 * h + c] * shift;
        v2[c] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, scale, v));
      }
      if (pairs && col + 1 < a.n) {
        *reinterpret_cast<uint32_t*>(o + col) = uint32_t(v2[0]) | uint32_t(v2[1]) << 16;
      } else {
        o[col] = v2[0];
        if (col + 1 < a.n) o[col + 1] = v2[1];
      }
    }
  }
}

template <WeightKind F, bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int items, cudaStream_t stream) {
  constexpr int bn = kRowsB / (kSwiglu ? 2 : 1);
  const int n_tiles = (a.n + bn - 1) / bn;
  const int64_t ctas = int64_t(n_tiles) * items;
  if (ctas > INT_MAX) return cudaErrorInvalidValue;
  launch_kernel(wgmma_linear_kernel<F, kSwiglu>, dim3(unsigned(ctas)), kThreads, kSmemBytes, stream, a, n_tiles,
                items);
  return cudaGetLastError();
}

template <bool kSwiglu>
cudaError_t launch_epilogue(const LinearArgs& a, int items, cudaStream_t stream) {
  return dispatch_mma_kind(a.w[0].kind, [&](auto kind) { return launch_kind<decltype(kind)::value, kSwiglu>(a, items, stream); });
}

template <WeightKind F>
cudaError_t set_smem_limit() {
  cudaError_t e = cudaFuncSetAttribute(wgmma_linear_kernel<F, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSmemBytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(wgmma_linear_kernel<F, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
}

}  // namespace

cudaError_t init_linear_wgmma_kernels() {
  cudaError_t e;
  if ((e = set_smem_limit<WeightKind::kBF16>()) != cudaSuccess) return e;
  if ((e = set_smem_limit<WeightKind::kFp8>()) != cudaSuccess) return e;
  if ((e = set_smem_limit<WeightKind::kMxfp8>()) != cudaSuccess) return e;
  return set_smem_limit<WeightKind::kNvfp4>();
}

cudaError_t launch_linear_wgmma(const LinearArgs& a, int items, cudaStream_t stream) {
  return a.epilogue == Epilogue::kSwiglu ? launch_epilogue<true>(a, items, stream)
                                         : launch_epilogue<false>(a, items, stream);
}

}  // namespace m3::cuda::detail
