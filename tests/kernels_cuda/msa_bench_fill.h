// Device-side random fill for the benchmark: caches of several GB are filled on the GPU.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace m3::cuda::testing {

// Random bytes; e4m3_finite avoids the E4M3 NaN codes 0x7f and 0xff.
cudaError_t fill_random_bytes(void* dst, size_t bytes, uint64_t seed, bool e4m3_finite, cudaStream_t stream);
// Random bf16 values, roughly normal with unit variance.
cudaError_t fill_random_bf16(uint16_t* dst, size_t count, uint64_t seed, cudaStream_t stream);
// In each of `num_blocks` blocks (stride block_bytes), rewrites the byte ranges
// [region_offsets[i], + region_bytes) with NVFP4 scale bytes 0x18..0x38 (1/16 .. 1, the vendor's
// test range), so that random NVFP4 data decodes to finite values. region_offsets is on the device.
cudaError_t fix_nvfp4_scales(uint8_t* pool, int64_t num_blocks, int64_t block_bytes,
                             const int64_t* region_offsets, int num_regions, int region_bytes,
                             uint64_t seed, cudaStream_t stream);

// The accumulation precision of Hopper's FP8 tensor-core MMA (mma.sync m16n8k32 e4m3, fp32
// accumulators), for choosing the indexer's MMA: `trials` warps each multiply random E4M3
// fragments over k = 128 (four MMAs into one accumulator); out[trial * 128 + e] gets D element e
// of lane e / 4, and a/b the operands in the fragments' element order (a: [trial][16][128] row
// major, b: [trial][8][128]), so that the host can compute the exact sums.
cudaError_t fp8_mma_probe(const uint8_t* a, const uint8_t* b, float* out, int trials, cudaStream_t stream);

// The same question for wgmma, the MMA the sparse attention walks and the indexer use: `trials`
// warpgroups each multiply a [64][128] E4M3 A by a [16][128] E4M3 B (D = A B^T, k = 128) twice,
// by 4 m64n16k32 E4M3 MMAs into one accumulator (out_e4m3) and by 8 m64n16k16 MMAs on the same
// values widened to fp16 (out_f16). out[(trial * 64 + row) * 16 + column]; a is [trial][64][128],
// b [trial][16][128].
cudaError_t wgmma_sum_probe(const uint8_t* a, const uint8_t* b, float* out_e4m3, float* out_f16, int trials,
                            cudaStream_t stream);

}  // namespace m3::cuda::testing
