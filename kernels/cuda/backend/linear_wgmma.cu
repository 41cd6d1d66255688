// Prefill-shaped linear layers (items of 128 rows) on Hopper's warpgroup MMA: y = x W^T with W
// expanded to bf16 into shared memory (never a dequantized copy in device memory), fp32
// accumulation in registers. Same numerics as the skinny kernel (linear.cu): exact bf16 expansion
// of the weights, the second-level / per-tensor scale and the SwiGLU epilogue on the fp32 sum;
// only the fp32 summation order differs.
//
// CTA: 256 threads = 2 warpgroups; tile 128 rows x 128 B rows (128 features, or 64 gate + 64 up
// features for the fused SwiGLU, so a thread holds a feature's gate and up sums together), K steps
// of 64. Both operands sit in shared memory in the 128-byte-swizzled K-major layout wgmma reads
// through matrix descriptors: x rows staged by cp.async, weight chunks loaded to registers one K
// step ahead and expanded into the B tile while the tensor cores run the current step
// (wgmma.mma_async is asynchronous), two stages. Each warpgroup issues 4 m64n128k16 per K step.
// (Three stages with the previous step's MMAs left running, wait_group 1, measured 2-9% slower:
// docs/gpu-backend-notes.md, "Prefill, session 4".)
#include <cuda_bf16.h>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kRowsM = kWgmmaItemRows;  // rows per CTA (2 warpgroups x 64)
static_assert(kRowsM == 128, "two warpgroups of 64 rows");
constexpr int kRowsB = 128;      // B tile rows (weight rows, all weights together)
constexpr int kStepK = 64;       // K elements per step: one 128-byte swizzle row
constexpr int kStages = 2;
constexpr int kTileBytesA = kRowsM * kStepK * 2;
constexpr int kTileBytesB = kRowsB * kStepK * 2;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
// The swizzle pattern repeats every 1024 bytes and the descriptors assume tiles aligned to it:
// the dynamic allocation is over-sized by one pattern and aligned by hand.
constexpr int kSmemBytes = kStages * kStageBytes + 1024;

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a 128-byte-swizzled tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Ordinary stores (and cp.async) to shared memory become visible to the tensor cores' async
// proxy only after this fence in the writing thread (then a barrier).
// Pins the accumulators in place: the compiler must not move their reads or writes across the
// wgmma fence / wait that bracket the asynchronous MMAs.
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64 x 128] += A[64 x 16] B[128 x 16]^T, both bf16 from shared memory, fp32 accumulators in
// the warpgroup's registers (thread layout of mma.sync m16n8 per 8 columns: d[4 j + 2 h + c] is
// row 16 warp + g + 8 h, column 8 j + 2 q + c).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

template <WeightKind F, bool kSwiglu>
__global__ void __launch_bounds__(256, 2) wgmma_linear_kernel(const LinearArgs a) {
  kernel_prologue();
  using Fmt = WeightFmt<F>;
  constexpr int E = Fmt::kElems, NW = kSwiglu ? 2 : 1, BN = kRowsB / NW;  // features per CTA
  constexpr int A_CHUNKS = kRowsM * kStepK / 8 / 256;    // 16-byte x chunks per thread
  constexpr int B_CHUNKS = kRowsB * (kStepK / E) / 256;  // weight chunks per thread
  static_assert(A_CHUNKS >= 1 && B_CHUNKS >= 1, "tile shape");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem_base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (smem_base - smem_u32(smem_raw));

  const ItemInfo info = item_of(a, blockIdx.y);
  if (!info.valid) return;
  const LinearItem item = info.item;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int n0 = blockIdx.x * BN;
  WeightView w[NW];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j] = weight_of(a, j, item.expert);

  // The x chunks this thread stages (row r, chunk c of each 64-element step) and the weight chunks
  // it expands (B row `slot` = j * BN + feature, elements [col, col + E) of each step).
  const uint16_t* arow[A_CHUNKS];
  int a_r[A_CHUNKS], a_c[A_CHUNKS];
#pragma unroll
  for (int i = 0; i < A_CHUNKS; ++i) {
    const int id = tid + i * 256;
    a_r[i] = id / (kStepK / 8);
    a_c[i] = id % (kStepK / 8);
    arow[i] = a_r[i] < item.row_count ? a.x + src_row(a, item.row_begin + a_r[i]) * a.x_stride : nullptr;
  }
  const uint8_t* brow[B_CHUNKS];
  const uint8_t* bscale[B_CHUNKS];
  int b_slot[B_CHUNKS], b_col[B_CHUNKS];
#pragma unroll
  for (int i = 0; i < B_CHUNKS; ++i) {
    const int id = tid + i * 256, per_row = kStepK / E;
    const int slot = id / per_row;
    const int j = slot / BN, n = n0 + slot % BN;
    b_slot[i] = slot;
    b_col[i] = (id % per_row) * E;
    brow[i] = n < a.n ? w[j].data + int64_t(n) * w[j].row_bytes : nullptr;
    bscale[i] = n < a.n && w[j].scale != nullptr ? w[j].scale + int64_t(n) * w[j].scale_stride : nullptr;
  }

  auto stage_a = [&](int kt, int buf) {
    uint8_t* dst = smem + buf * kStageBytes;
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
      const int k = kt * kStepK + a_c[i] * 8;
      uint8_t* d = dst + swizzled(a_r[i], a_c[i]);
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
      const int64_t k = int64_t(kt) * kStepK + b_col[i];
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
    uint8_t* dst = smem + buf * kStageBytes + kTileBytesA;
#pragma unroll
    for (int i = 0; i < B_CHUNKS; ++i)
#pragma unroll
      for (int s = 0; s < E / 8; ++s)
        *reinterpret_cast<uint4*>(dst + swizzled(b_slot[i], b_col[i] / 8 + s)) = decode_sub<F>(braw[i], s, bsc[i]);
  };

  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;

  const int k_tiles = (a.k + kStepK - 1) / kStepK;
  stage_a(0, 0);
  load_b(0);
  store_b(0);
  cp_async_wait<0>();
  fence_async_shared();
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int cur = kt & 1;
    const bool more = kt + 1 < k_tiles;
    if (more) {
      stage_a(kt + 1, cur ^ 1);
      load_b(kt + 1);
    }
    const uint32_t a_tile = smem_base + cur * kStageBytes + wg * (kTileBytesA / 2);
    const uint32_t b_tile = smem_base + cur * kStageBytes + kTileBytesA;
    fence_operands(d);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kStepK / 16; ++ks) wgmma_m64n128k16(d, smem_desc(a_tile + ks * 32), smem_desc(b_tile + ks * 32));
    wgmma_commit();
    // The next step's weights expand while the tensor cores run this one.
    if (more) store_b(cur ^ 1);
    wgmma_wait_all();
    fence_operands(d);
    if (more) {
      cp_async_wait<0>();
      fence_async_shared();
    }
    __syncthreads();
  }

  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg * 64 + warp * 16 + g + 8 * h;
    if (row >= item.row_count) continue;
    uint16_t* o = a.out + int64_t(item.row_begin + row) * a.out_stride;
#pragma unroll
    for (int j = 0; j < 16 / NW; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = n0 + j * 8 + 2 * q + c;
        if (col >= a.n) continue;
        float v[NW];
#pragma unroll
        for (int wi = 0; wi < NW; ++wi) v[wi] = d[4 * (j + wi * 8) + 2 * h + c];
        o[col] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, w, v));
      }
  }
}

template <WeightKind F, bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int items, cudaStream_t stream) {
  constexpr int bn = kRowsB / (kSwiglu ? 2 : 1);
  const dim3 grid((a.n + bn - 1) / bn, items);
  launch_kernel(wgmma_linear_kernel<F, kSwiglu>, grid, 256, kSmemBytes, stream, a);
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
