// Warp-level row operations shared by the elementwise kernels and the fused attention input path:
// per-head Gemma RMSNorm + rotate-half RoPE with the CPU reference's bf16 rounding sequence
// (kernels/cpu/cpu_backend.cc head_norm_rope), and the quantized encoding of one cache row
// (kernels/cpu/attention.cc encode_row; bit-identical through the formats/ codecs).
#pragma once
#include <cstdint>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "ops/kv_layout.h"

namespace m3::cuda::detail {

// The reference's norm of one row held in v[0, n): v = bf16((v * r) * (1 + w)) with
// r = 1 / sqrt(float(sum v^2 / n in double) + eps). One warp; v in shared memory.
__device__ __forceinline__ void warp_rms_norm_inplace(float* v, int n, const float* w, float eps) {
  const int lane = threadIdx.x & 31;
  double ss = 0.0;
  for (int i = lane; i < n; i += 32) ss += double(v[i]) * double(v[i]);
  ss = warp_sum(ss);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / n), eps)));
  for (int i = lane; i < n; i += 32) v[i] = round_bf16(__fmul_rn(__fmul_rn(v[i], r), __fadd_rn(1.0f, w[i])));
  __syncwarp();
}

// Rotate-half RoPE of v[0, rope_dims) in place: pairs (c, c + rope_dims / 2), cos/sin of channel
// j = table[j % rope_half] (the reference's duplicated table truncated to rope_dims channels).
__device__ __forceinline__ void warp_rope_inplace(float* v, int rope_dims, const float* cos_row,
                                                  const float* sin_row, int rope_half) {
  const int lane = threadIdx.x & 31;
  const int half = rope_dims / 2;
  for (int c = lane; c < half; c += 32) {
    const float a = v[c], b = v[c + half];
    const int j0 = c % rope_half, j1 = (c + half) % rope_half;
    const float x0 = round_bf16(__fadd_rn(round_bf16(__fmul_rn(a, cos_row[j0])), round_bf16(__fmul_rn(-b, sin_row[j0]))));
    const float x1 = round_bf16(__fadd_rn(round_bf16(__fmul_rn(b, cos_row[j1])), round_bf16(__fmul_rn(a, sin_row[j1]))));
    v[c] = x0;
    v[c + half] = x1;
  }
  __syncwarp();
}

__device__ __forceinline__ void warp_load_bf16(const uint16_t* src, float* v, int n) {
  for (int i = threadIdx.x & 31; i < n; i += 32) v[i] = bf16_bits_to_f32(src[i]);
  __syncwarp();
}

__device__ __forceinline__ void warp_store_bf16(const float* v, uint16_t* dst, int n) {
  for (int i = threadIdx.x & 31; i < n; i += 32) dst[i] = f32_to_bf16_bits(v[i]);
}

// Norm + RoPE of one head: src bf16 -> v (shared, rounded values) -> dst bf16 (may alias src).
__device__ __forceinline__ void warp_head_norm_rope(const uint16_t* src, uint16_t* dst, float* v, int head_dim,
                                                    const float* norm, float eps, int rope_dims,
                                                    const float* cos_row, const float* sin_row, int rope_half) {
  warp_load_bf16(src, v, head_dim);
  warp_rms_norm_inplace(v, head_dim, norm, eps);
  if (rope_dims > 0) warp_rope_inplace(v, rope_dims, cos_row, sin_row, rope_half);
  warp_store_bf16(v, dst, head_dim);
  __syncwarp();
}

// Encodes v[0, dim) (shared memory) into one NVFP4 cache row: not inlined, so that the kernels
// that encode several kinds of rows (K, V, index-K) hold one copy of the scale search's unrolled
// code (inlined at every call site it doubled attention_input's code and made its one-token
// launches slower by instruction-cache misses).
static __device__ __noinline__ void warp_encode_nvfp4_row(const float* v, int dim, uint8_t* data, uint8_t* scales) {
  const int lane = threadIdx.x & 31;
  // Four lanes per 16-element group (eight groups per pass), so a 128-wide row keeps all 32
  // lanes busy; the same bytes as formats/ nvfp4_kv_encode_group: each lane holds its group's
  // 16 values in registers, and the scale search's six candidates are shared out, lane q
  // scoring candidates q and q + 4 (each error summed in the formats/ order, division-free).
  // The winner is the sequential search's: the least error, the lower candidate on a tie; a
  // NaN error never wins, except candidate 0's, which the sequential search never leaves.
  const int groups = dim / kNvfp4Group;
  for (int base = 0; base < groups; base += 8) {  // warp-uniform bound: every lane shuffles
    const int g = base + (lane >> 2), quarter = lane & 3;
    const bool active = g < groups;
    float x[kNvfp4Group];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kNvfp4Group; ++i) {
      x[i] = active ? v[g * kNvfp4Group + i] : 0.0f;
      amax = fmaxf(amax, fabsf(x[i]));
    }
    const int base_code = nvfp4_kv_scale(amax);
    float best_err = INFINITY;
    int best_k = kNvfp4ScaleCandidates;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int k = quarter + 4 * j;  // rises with j: a tie keeps the lower
      if (active && k < kNvfp4ScaleCandidates) {
        float err = nvfp4_kv_group_error(x, nvfp4_kv_candidate(base_code, k));
        if (isnan(err)) err = k == 0 ? -INFINITY : INFINITY;
        if (err < best_err) best_err = err, best_k = k;
      }
    }
#pragma unroll
    for (int offset = 1; offset <= 2; offset <<= 1) {
      const float other_err = __shfl_xor_sync(0xffffffffu, best_err, offset);
      const int other_k = __shfl_xor_sync(0xffffffffu, best_k, offset);
      if (other_err < best_err || (other_err == best_err && other_k < best_k)) best_err = other_err, best_k = other_k;
    }
    if (active) {
      const uint8_t sc = nvfp4_kv_candidate(base_code, best_k);
      const E2m1Bounds bounds = e2m1_bounds(fp8_e4m3_decode(sc));
      const float* own = v + g * kNvfp4Group + quarter * 4;
      uint8_t* out = data + g * (kNvfp4Group / 2) + quarter * 2;
      out[0] = static_cast<uint8_t>(e2m1_encode_scaled(own[0], bounds) | (e2m1_encode_scaled(own[1], bounds) << 4));
      out[1] = static_cast<uint8_t>(e2m1_encode_scaled(own[2], bounds) | (e2m1_encode_scaled(own[3], bounds) << 4));
      if (quarter == 0) scales[g] = sc;
    }
  }
}

// Encodes v[0, dim) (shared memory) into one cache row of `dtype`.
__device__ __forceinline__ void warp_encode_row(KvDType dtype, const float* v, int dim, uint8_t* data,
                                                uint8_t* scales) {
  const int lane = threadIdx.x & 31;
  switch (dtype) {
    case KvDType::kF32:
      for (int i = lane; i < dim; i += 32) reinterpret_cast<float*>(data)[i] = v[i];
      break;
    case KvDType::kBF16:
      for (int i = lane; i < dim; i += 32) reinterpret_cast<uint16_t*>(data)[i] = f32_to_bf16_bits(v[i]);
      break;
    case KvDType::kFP8:
      for (int i = lane; i < dim; i += 32) data[i] = fp8_e4m3_encode(v[i]);
      break;
    case KvDType::kNVFP4:
      warp_encode_nvfp4_row(v, dim, data, scales);
      break;
  }
  __syncwarp();
}

}  // namespace m3::cuda::detail
