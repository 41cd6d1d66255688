#include "tests/kernels_cuda/msa_bench_fill.h"

#include "kernels/cuda/wgmma.cuh"

namespace m3::cuda::testing {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void bytes_kernel(uint64_t* dst, size_t words, uint64_t seed, bool e4m3_finite) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t v = mix(seed ^ (i * 0x2545f4914f6cdd1dull));
    if (e4m3_finite) {  // 0x7f / 0xff (E4M3 NaN) -> 0x7e / 0xfe
      const uint64_t low7 = v & 0x7f7f7f7f7f7f7f7full;
      v ^= ((low7 + 0x0101010101010101ull) & 0x8080808080808080ull) >> 7;
    }
    dst[i] = v;
  }
}

__global__ void bf16_kernel(uint16_t* dst, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix(seed ^ (i * 0x2545f4914f6cdd1dull));
    // Sum of four uniforms, centred and scaled to unit variance (Irwin-Hall).
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) s += float((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
    const float x = (s - 2.0f) * 1.7320508f;
    dst[i] = static_cast<uint16_t>(__float_as_uint(x) >> 16);
  }
}

__global__ void scales_kernel(uint8_t* pool, int64_t block_bytes, const int64_t* offsets, int num_regions,
                              int region_bytes, uint64_t seed) {
  uint8_t* block = pool + blockIdx.x * block_bytes;
  for (int r = 0; r < num_regions; ++r)
    for (int i = threadIdx.x; i < region_bytes; i += blockDim.x) {
      const uint64_t h = mix(seed ^ ((uint64_t(blockIdx.x) * num_regions + r) << 20) ^ uint64_t(i));
      block[offsets[r] + i] = static_cast<uint8_t>(0x18 + h % 0x21);
    }
}

}  // namespace

cudaError_t fill_random_bytes(void* dst, size_t bytes, uint64_t seed, bool e4m3_finite, cudaStream_t stream) {
  bytes_kernel<<<4096, 256, 0, stream>>>(static_cast<uint64_t*>(dst), bytes / 8, seed, e4m3_finite);
  return cudaGetLastError();
}

cudaError_t fill_random_bf16(uint16_t* dst, size_t count, uint64_t seed, cudaStream_t stream) {
  bf16_kernel<<<2048, 256, 0, stream>>>(dst, count, seed);
  return cudaGetLastError();
}

cudaError_t fix_nvfp4_scales(uint8_t* pool, int64_t num_blocks, int64_t block_bytes, const int64_t* region_offsets,
                             int num_regions, int region_bytes, uint64_t seed, cudaStream_t stream) {
  if (num_blocks == 0 || num_regions == 0) return cudaSuccess;
  scales_kernel<<<static_cast<unsigned>(num_blocks), 256, 0, stream>>>(pool, block_bytes, region_offsets,
                                                                        num_regions, region_bytes, seed);
  return cudaGetLastError();
}

namespace {

__global__ void fp8_mma_probe_kernel(const uint8_t* a, const uint8_t* b, float* out) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const uint8_t* at = a + size_t(blockIdx.x) * 16 * 128;
  const uint8_t* bt = b + size_t(blockIdx.x) * 8 * 128;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < 128; k0 += 32) {
    // A: reg0 row g, k 4t..4t+3; reg1 row g + 8; reg2, reg3 the same rows at k + 16. B: k 4t.. and
    // 16 + 4t.., column g.
    auto word = [](const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); };
    const uint32_t a0 = word(at + g * 128 + k0 + 4 * t), a1 = word(at + (g + 8) * 128 + k0 + 4 * t);
    const uint32_t a2 = word(at + g * 128 + k0 + 16 + 4 * t), a3 = word(at + (g + 8) * 128 + k0 + 16 + 4 * t);
    const uint32_t b0 = word(bt + g * 128 + k0 + 4 * t), b1 = word(bt + g * 128 + k0 + 16 + 4 * t);
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  for (int c = 0; c < 4; ++c) out[size_t(blockIdx.x) * 128 + lane * 4 + c] = d[c];
}

// One warpgroup per trial: B in shared memory twice (E4M3 K-major core matrices, and the same values
// as fp16), A as register fragments (warp w: rows 16w..16w+15).
__global__ void __launch_bounds__(128) wgmma_sum_probe_kernel(const uint8_t* a, const uint8_t* b, float* out_e4m3,
                                                             float* out_f16) {
  using namespace m3::cuda::detail;
  __shared__ __align__(128) uint8_t b8[16 * 128];
  __shared__ __align__(128) uint8_t b16[16 * 128 * 2];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const uint8_t* at = a + size_t(blockIdx.x) * 64 * 128;
  const uint8_t* bt = b + size_t(blockIdx.x) * 16 * 128;
  for (int i = tid; i < 16 * 64; i += 128) {  // byte pairs (row n, elements 2p, 2p + 1)
    const int n = i >> 6, p = 2 * (i & 63);
    const uint16_t pair = *reinterpret_cast<const uint16_t*>(bt + n * 128 + p);
    *reinterpret_cast<uint16_t*>(b8 + wgmma_q_offset(n, p)) = pair;
    *reinterpret_cast<uint32_t*>(b16 + wgmma_f16_offset(n, p)) = e4m3x2_to_f16x2(pair);
  }
  fence_async_shared();
  __syncthreads();
  auto word = [](const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); };
  auto pair = [](const uint8_t* p) { return uint32_t(*reinterpret_cast<const uint16_t*>(p)); };
  const uint8_t* r0 = at + (16 * warp + g) * 128;
  const uint8_t* r1 = r0 + 8 * 128;
  float d8[8], d16[8];
  for (int c = 0; c < 8; ++c) d8[c] = d16[c] = 0.0f;
  wgmma_fence();
  for (int s = 0; s < 4; ++s) {
    const uint32_t af[4] = {word(r0 + 32 * s + 4 * t), word(r1 + 32 * s + 4 * t), word(r0 + 32 * s + 16 + 4 * t),
                            word(r1 + 32 * s + 16 + 4 * t)};
    wgmma_e4m3<16>(d8, af, wgmma_desc(b8 + 2 * s * kQCoreK, kQCoreK, kQCoreN), s > 0);
  }
  for (int ks = 0; ks < 8; ++ks) {
    const uint32_t af[4] = {e4m3x2_to_f16x2(pair(r0 + 16 * ks + 2 * t)), e4m3x2_to_f16x2(pair(r1 + 16 * ks + 2 * t)),
                            e4m3x2_to_f16x2(pair(r0 + 16 * ks + 8 + 2 * t)),
                            e4m3x2_to_f16x2(pair(r1 + 16 * ks + 8 + 2 * t))};
    wgmma_f16<16>(d16, af, wgmma_desc(b16 + 2 * ks * kF16CoreK, kF16CoreK, kF16CoreN), ks > 0);
  }
  wgmma_commit();
  wgmma_wait_all();
  wgmma_pin<16>(d8);
  wgmma_pin<16>(d16);
  // d[4j + 2h + c]: row 16w + g + 8h, column 8j + 2t + c.
  for (int j = 0; j < 2; ++j)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 2; ++c) {
        const size_t e = (size_t(blockIdx.x) * 64 + 16 * warp + g + 8 * h) * 16 + 8 * j + 2 * t + c;
        out_e4m3[e] = d8[4 * j + 2 * h + c];
        out_f16[e] = d16[4 * j + 2 * h + c];
      }
}

}  // namespace

cudaError_t wgmma_sum_probe(const uint8_t* a, const uint8_t* b, float* out_e4m3, float* out_f16, int trials,
                            cudaStream_t stream) {
  wgmma_sum_probe_kernel<<<trials, 128, 0, stream>>>(a, b, out_e4m3, out_f16);
  return cudaGetLastError();
}

cudaError_t fp8_mma_probe(const uint8_t* a, const uint8_t* b, float* out, int trials, cudaStream_t stream) {
  fp8_mma_probe_kernel<<<trials, 32, 0, stream>>>(a, b, out);
  return cudaGetLastError();
}

}  // namespace m3::cuda::testing
