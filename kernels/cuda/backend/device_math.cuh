// Device helpers of the backend kernels: bf16 rounding as the CPU reference does it (formats/bf16.h,
// bit-identical), the SwiGLU-OAI activation with the reference's bf16 rounding points, warp
// reductions.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "formats/bf16.h"

namespace m3::cuda::detail {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// Round to nearest even, as bf16_encode: the conversion instruction, which gives the integer rule's
// bits for every float but NaN (weight_decode_check runs all 2^32), in about half the instructions;
// NaN keeps the rule's quiet NaN with its sign and payload, whatever the instruction makes of it.
// The norm and RoPE kernels round every intermediate this way.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint16_t h = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  return f != f ? static_cast<uint16_t>((__float_as_uint(f) >> 16) | 0x0040u) : h;
}
__device__ __forceinline__ float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

// SwiGLU-OAI of one element in bf16 mode (kernels/cpu/cpu_linear.cc swiglu_oai): gate and up are
// bf16 values, every intermediate is rounded to bf16 where the Hugging Face model rounds.
__device__ __forceinline__ float swiglu_oai_bf16(float gate, float up, float alpha, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  const float ga = round_bf16(__fmul_rn(g, alpha));
  const float sig = round_bf16(1.0f / (1.0f + expf(-ga)));
  const float glu = round_bf16(__fmul_rn(g, sig));
  return round_bf16(__fmul_rn(round_bf16(__fadd_rn(u, 1.0f)), glu));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace m3::cuda::detail
