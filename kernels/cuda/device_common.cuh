// Device helpers shared by the MSA kernels: async copies, tensor-core fragments (mma.sync
// m16n8k16 with fp32 accumulation), and the staging + expansion of 64-token cache tiles.
//
// Hopper has no FP4 matrix instructions, so an NVFP4 tile is expanded in shared memory to the
// MMA's input type. The expansion computes the Q8KV4 view E4M3(e2m1 * scale) (ops/attention.h)
// with a 256-entry table (per scale byte, the E4M3 bytes of the 8 e2m1 magnitudes times that
// scale, built on the device with the formats/ codecs, so bit-identical to the CPU) and two byte
// permutes per 4 codes; E4M3 values are exact in fp16, so the MMA sees exactly that view.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "kernels/cuda/msa_kernels.h"

namespace m3::cuda::detail {

// CTAs of `kernel` (`threads` a CTA, `smem` dynamic bytes) that fit on one multiprocessor; 1 when
// the query fails.
template <class Kernel>
int ctas_per_sm(Kernel kernel, int smem, int threads = 128) {
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem);
  return e == cudaSuccess && n > 0 ? n : 1;
}

// The softmax's base-2 constants: log2(e), and the P8 path's 448 = 2^kLog2_448 = e^kLn448.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLog2_448 = 8.80735492706298828125f;
inline constexpr float kLn448 = 6.104793232414985f;

// Halves per shared-memory tile row: 272-byte rows keep ldmatrix and 16-byte stores free of bank
// conflicts.
inline constexpr int kTileStride = kDim + 8;
inline constexpr int kTileBytes = kTileTokens * kTileStride * 2;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
// A 16-byte copy, or 16 zero bytes when !valid (src is then not read but must be a mapped address).
__device__ __forceinline__ void cp_async16_or_zero(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// atomicAdd with acquire-release semantics at device scope: after a CTA barrier, one thread's
// arrival releases the whole CTA's earlier stores and acquires those of the CTAs before it.
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Named barrier kId (1..15; 0 is __syncthreads') over kCount threads (a multiple of 32): sync
// waits until that many have arrived, arrive counts the calling warp and goes on (a producer
// warpgroup handing a buffer to its consumer, or a consumer handing it back). The id is an
// immediate: with a register id ptxas reserves all 16 barriers for the kernel.
template <int kId, int kCount>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}
template <int kId, int kCount>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kCount) : "memory");
}

// A warpgroup's per-thread register limit moved to N (a multiple of 8 in 24..256; sm_90a): a
// warp-specialised CTA gives its producer's registers to its consumer. Every warp of the
// warpgroup executes it.
template <int N>
__device__ __forceinline__ void warpgroup_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d += a * b for one m16n8k16 tile; kBf16 picks bf16 inputs, else fp16.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Two E4M3 bytes (low byte = first element) to an fp16 pair; exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(static_cast<uint16_t>(two_bytes)));
  return out;
}

// fp16 pair to bf16 pair, exact for the E4M3 values that reach it.
__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t h) {
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  return pack2<true>(f.x, f.y);
}

// Saturating round-to-nearest-even E4M3 bytes of (lo, hi), lo in the low byte: the hardware
// conversion of the probability path's P8 = E4M3(448 p) (docs/reference.md 3.2, cvt.satfinite as
// in production) and of activations cast to E4M3.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float lo, float hi) {
  uint16_t e;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(e) : "f"(hi), "f"(lo));
  return e;
}

// The same, returned as an fp16 pair.
__device__ __forceinline__ uint32_t f32x2_to_e4m3_as_f16x2(float lo, float hi) {
  return e4m3x2_to_f16x2(f32x2_to_e4m3x2(lo, hi));
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_max_quad(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float warp_sum_quad(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Bytes one staged 64-token tile of a slot occupies in shared memory: raw data + scale rows for
// fp8/nvfp4 (expanded afterwards), the padded MMA tile itself for bf16.
__host__ __device__ constexpr int staged_tile_bytes(KvDType fmt) {
  return fmt == KvDType::kBF16    ? kTileBytes
         : fmt == KvDType::kFP8   ? kTileTokens * kDim
                                  : kTileTokens * (kDim / 2 + kDim / 16);
}

// Issues the async copies of tokens [tok0, tok0 + 64) of one slot (data rows at `rows`, scale
// rows at `scale_rows`) into `dst`. All kThreadCount threads of the CTA take part.
template <KvDType kFmt, int kThreadCount>
__device__ __forceinline__ void stage_tile(uint8_t* dst, const uint8_t* rows,
                                          const uint8_t* scale_rows, int tid) {
  constexpr int nthreads = kThreadCount;
  if constexpr (kFmt == KvDType::kBF16) {
    for (int c = tid; c < kTileTokens * 16; c += nthreads)
      cp_async16(dst + (c >> 4) * (kTileStride * 2) + (c & 15) * 16, rows + c * 16);
  } else if constexpr (kFmt == KvDType::kFP8) {
    for (int c = tid; c < kTileTokens * kDim / 16; c += nthreads) cp_async16(dst + c * 16, rows + c * 16);
  } else {
    // 256 chunks of codes (rows of 64 bytes, side by side), then 32 chunks of scales: a fixed
    // number of copies per thread, no per-chunk branch.
    constexpr int kData = kTileTokens * kDim / 2 / 16;
    constexpr int kScale = kTileTokens * kDim / 16 / 16;
    static_assert(kData % nthreads == 0 && kScale <= nthreads, "stage_tile: nvfp4 chunks per thread");
#pragma unroll
    for (int k = 0; k < kData / nthreads; ++k) cp_async16(dst + (tid + k * nthreads) * 16, rows + (tid + k * nthreads) * 16);
    if (tid < kScale) cp_async16(dst + kData * 16 + tid * 16, scale_rows + tid * 16);
  }
}

// Expands rows [row_begin, row_begin + kRows) of a staged fp8/nvfp4 tile into an MMA tile
// [64][kTileStride] of fp16 (kBf16 = false) or bf16 values, with kThreadCount threads (tid counts
// from 0 among them). nvfp4 yields the E4M3 view; fp8 is exact either way.
template <KvDType kFmt, bool kBf16, int kRows, int kThreadCount>
__device__ __forceinline__ void expand_rows(const uint8_t* raw, const uint2* table, uint8_t* tile,
                                            int row_begin, int tid) {
  constexpr int nthreads = kThreadCount;
  if constexpr (kFmt == KvDType::kNVFP4) {
    // One 16-element group (8 bytes of codes, one scale byte) per thread and step.
    const uint2* groups = reinterpret_cast<const uint2*>(raw);
    const uint8_t* scales = raw + kTileTokens * kDim / 2;
#pragma unroll
    for (int k = tid; k < kRows * kDim / 16; k += nthreads) {
      const int i = row_begin * (kDim / 16) + k;
      const int row = i >> 3, group = i & 7;
      const uint2 w = groups[i];
      const uint2 t = table[scales[i]];
      uint4 half[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t x = h ? w.y : w.x;  // 8 codes: elements 16*group + 8*h ..
        // Magnitudes through the table (selector = code & 7), signs from bit 3 of each code.
        const uint32_t lo = __byte_perm(t.x, t.y, x & 0x7777u) | __byte_perm(0u, 0x80u, (x >> 1) & 0x4444u);
        const uint32_t hi =
            __byte_perm(t.x, t.y, (x >> 16) & 0x7777u) | __byte_perm(0u, 0x80u, (x >> 17) & 0x4444u);
        uint32_t f[4] = {e4m3x2_to_f16x2(lo), e4m3x2_to_f16x2(lo >> 16), e4m3x2_to_f16x2(hi),
                         e4m3x2_to_f16x2(hi >> 16)};
        if constexpr (kBf16) {
#pragma unroll
          for (int j = 0; j < 4; ++j) f[j] = f16x2_to_bf16x2(f[j]);
        }
        half[h] = make_uint4(f[0], f[1], f[2], f[3]);
      }
      // Groups 4..7 store their second half first: each store instruction of 8 threads then
      // covers all 32 banks.
      uint4* dst = reinterpret_cast<uint4*>(tile + row * (kTileStride * 2) + group * 32);
      const int first = group >> 2;
      dst[first] = first ? half[1] : half[0];
      dst[first ^ 1] = first ? half[0] : half[1];
    }
  } else if constexpr (kFmt == KvDType::kFP8) {
    const uint4* chunks = reinterpret_cast<const uint4*>(raw);
#pragma unroll
    for (int k = tid; k < kRows * kDim / 16; k += nthreads) {
      const int i = row_begin * (kDim / 16) + k;
      const int row = i >> 3, chunk = i & 7;  // 16 codes: elements 16*chunk ..
      const uint4 c = chunks[i];
      const uint32_t in[4] = {c.x, c.y, c.z, c.w};
      uint32_t h[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        h[2 * j] = e4m3x2_to_f16x2(in[j]);
        h[2 * j + 1] = e4m3x2_to_f16x2(in[j] >> 16);
        if constexpr (kBf16) {
          h[2 * j] = f16x2_to_bf16x2(h[2 * j]);
          h[2 * j + 1] = f16x2_to_bf16x2(h[2 * j + 1]);
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(tile + row * (kTileStride * 2) + chunk * 32);
      dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
      dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
  }
}

template <KvDType kFmt, bool kBf16, int kThreadCount>
__device__ __forceinline__ void expand_tile(const uint8_t* raw, const uint2* table, uint8_t* tile, int tid) {
  expand_rows<kFmt, kBf16, kTileTokens, kThreadCount>(raw, table, tile, 0, tid);
}

// Converts 8 activations (bf16 bits or E4M3 bytes) starting at element `i` of `src` into the MMA
// input type. kToE4M3: activation values are first cast to E4M3 (saturating, no scale), as the
// fp8/nvfp4 paths of ops/attention.h require.
template <bool kBf16, bool kToE4M3>
__device__ __forceinline__ uint4 load_act8(const void* src, ActKind kind, int64_t i) {
  float f[8];
  if (kind == ActKind::kBF16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(src) + i);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[2 * j] = bf16_decode(static_cast<uint16_t>(w[j]));
      f[2 * j + 1] = bf16_decode(static_cast<uint16_t>(w[j] >> 16));
    }
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(src) + i);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      f[j] = fp8_e4m3_decode(static_cast<uint8_t>((j < 4 ? raw.x : raw.y) >> (8 * (j & 3))));
  }
  if constexpr (kToE4M3) {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = fp8_e4m3_round(f[j]);
  }
  return make_uint4(pack2<kBf16>(f[0], f[1]), pack2<kBf16>(f[2], f[3]), pack2<kBf16>(f[4], f[5]),
                    pack2<kBf16>(f[6], f[7]));
}

// Exclusive prefix sum of v over the 32 lanes of a warp; `total` gets the sum.
__device__ __forceinline__ int warp_exclusive_scan(int v, int& total) {
  const int lane = threadIdx.x & 31;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  total = __shfl_sync(0xffffffffu, inc, 31);
  return inc - v;
}

// Exclusive prefix over the CTA's threads in index order (any multiple of 32 threads up to 1024);
// `total` gets the CTA's sum. `warp_sums`: one int a warp of shared memory, free again on return.
__device__ __forceinline__ int block_exclusive_scan(int v, int* warp_sums, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int warp_total;
  const int excl = warp_exclusive_scan(v, warp_total);
  if (lane == 0) warp_sums[warp] = warp_total;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) {
    const int s = warp_sums[w];
    if (w < warp) before += s;
    total += s;
  }
  __syncthreads();  // warp_sums is rewritten by the next call
  return before + excl;
}

// One sparse row's walk: warp 0 lists the tiles of selection slots [slot_begin, slot_end) of
// `row` (visible ones only, ascending), 32 slots at a time; returns the tile count on every lane.
__device__ __forceinline__ int list_row_tiles(const AttentionArgs& a, int row, int kv, int slot_begin, int slot_end,
                                              const int32_t* pages, int* tile_list, int* tile_phys) {
  const int lane = threadIdx.x & 31;
  const int bs = a.cache.block_size, tiles_per_block = bs / kTileTokens;
  const int pos = a.step.positions[row];
  int n = 0;
  for (int j0 = slot_begin; j0 < slot_end; j0 += 32) {
    const int j = j0 + lane;
    const int b = j < slot_end ? a.selection[(int64_t(row) * a.cache.num_kv_heads + kv) * a.topk + j] : -1;
    int count = 0, phys = 0;
    if (b >= 0 && b * bs <= pos) {
      count = min(tiles_per_block, (pos - b * bs) / kTileTokens + 1);
      phys = pages[b];
    }
    int total;
    const int at = n + warp_exclusive_scan(count, total);
    for (int h = 0; h < count; ++h) {
      tile_list[at + h] = b * tiles_per_block + h;
      tile_phys[at + h] = phys;
    }
    n += total;
  }
  return n;
}

}  // namespace m3::cuda::detail
