// Expansion of quantized weight chunks to bf16 in registers, exactly.
//
// A lane reads one 16-byte chunk of a weight row at a time (kElems elements) and turns it, 8
// elements at a time, into bf16 pairs for the tensor cores. Every expansion is exact:
//  - fp8 E4M3 values have 4 significant bits and bf16's exponent range covers theirs;
//  - MXFP8 multiplies by a power of two (exact unless the product leaves bf16's range, which
//    real scales never approach);
//  - NVFP4 e2m1 (2 significant bits) times the E4M3 group scale (4 bits) has at most 6 significant
//    bits: exact in bf16. The second-level scale (ModelOpt weight_scale_2, compressed-tensors
//    1/weight_global_scale) is applied to the fp32 dot product instead (WeightView::out_mul/out_div).
// fp8's per-tensor scale is likewise applied to the dot product.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "formats/fp8_e4m3.h"
#include "formats/ue8m0.h"
#include "kernels/cuda/backend/backend_kernels.h"

namespace m3::cuda::detail {

template <WeightKind F>
struct WeightFmt;
template <>
struct WeightFmt<WeightKind::kBF16> {
  static constexpr int kElems = 8;
  __device__ static int64_t byte_offset(int64_t k) { return 2 * k; }
};
template <>
struct WeightFmt<WeightKind::kFp8> {
  static constexpr int kElems = 16;
  __device__ static int64_t byte_offset(int64_t k) { return k; }
};
template <>
struct WeightFmt<WeightKind::kMxfp8> {
  static constexpr int kElems = 16;
  __device__ static int64_t byte_offset(int64_t k) { return k; }
};
template <>
struct WeightFmt<WeightKind::kNvfp4> {
  static constexpr int kElems = 32;
  __device__ static int64_t byte_offset(int64_t k) { return k / 2; }
};

// The per-chunk scale of a lane's chunk: mxfp8 one UE8M0 factor (the chunk lies inside one
// 32-element block); nvfp4 two E4M3 group scales as bf16 pairs (elements 0-15 and 16-31).
// Default (chunks outside the matrix, whose codes are zero): scales 1 and +0, so every product
// is an exact zero, never 0 * NaN.
struct ChunkScale {
  float mx = 1.0f;
  uint32_t fp4[2] = {0u, 0u};  // bf16 pairs
};

__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

template <WeightKind F>
__device__ __forceinline__ ChunkScale load_chunk_scale(const uint8_t* scale_row, int64_t k0) {
  ChunkScale s;
  if constexpr (F == WeightKind::kMxfp8) {
    s.mx = ue8m0_decode(__ldg(scale_row + k0 / 32));
  } else if constexpr (F == WeightKind::kNvfp4) {
    // Both group scales in one 2-byte load (k0 is a multiple of 32 and scale rows have an even
    // length, linear_has_mma_path), converted by the hardware: E4M3 -> f16 -> f32 -> bf16, exact.
    const uint16_t two = __ldg(reinterpret_cast<const uint16_t*>(scale_row + k0 / 16));
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(two));
    const float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
    const uint32_t ab = bf16x2_bits(__floats2bfloat162_rn(f.x, f.y));  // low half: element 0-15's
    s.fp4[0] = __byte_perm(ab, 0u, 0x1010);
    s.fp4[1] = __byte_perm(ab, 0u, 0x3232);
  }
  return s;
}

// Two E4M3 bytes (low byte first) to a bf16 pair, times `mul` (a power of two or 1): exact.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float mul) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  return bf16x2_bits(__floats2bfloat162_rn(f.x * mul, f.y * mul));
}

// Four e2m1 codes (the low 16 bits of `codes`, element j in nibble j) to two bf16 pairs
// (unscaled): magnitudes through byte tables of the bf16 high and low bytes, sign from bit 3.
__device__ __forceinline__ void e2m1x4_to_bf16x2(uint32_t codes, uint32_t& w0, uint32_t& w1) {
  // bf16 of 0, .5, 1, 1.5, 2, 3, 4, 6: 0000 3F00 3F80 3FC0 4000 4040 4080 40C0.
  const uint32_t sel = codes & 0x7777u;
  const uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel) | __byte_perm(0u, 0x80u, (codes >> 1) & 0x4444u);
  const uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel);
  w0 = __byte_perm(lo, hi, 0x5140u);
  w1 = __byte_perm(lo, hi, 0x7362u);
}

// Elements [8 s, 8 s + 8) of a chunk as four bf16 pairs (element order).
template <WeightKind F>
__device__ __forceinline__ uint4 decode_sub(const uint4& raw, int s, const ChunkScale& sc) {
  if constexpr (F == WeightKind::kBF16) {
    return raw;
  } else if constexpr (F == WeightKind::kFp8 || F == WeightKind::kMxfp8) {
    const uint32_t a = s == 0 ? raw.x : raw.z, b = s == 0 ? raw.y : raw.w;
    const float mul = F == WeightKind::kMxfp8 ? sc.mx : 1.0f;
    return make_uint4(e4m3x2_to_bf16x2(a, mul), e4m3x2_to_bf16x2(a >> 16, mul), e4m3x2_to_bf16x2(b, mul),
                      e4m3x2_to_bf16x2(b >> 16, mul));
  } else {
    const uint32_t word = s == 0 ? raw.x : s == 1 ? raw.y : s == 2 ? raw.z : raw.w;
    uint32_t w[4];
    e2m1x4_to_bf16x2(word, w[0], w[1]);
    e2m1x4_to_bf16x2(word >> 16, w[2], w[3]);
    uint32_t scale_bits = sc.fp4[s >> 1];
    const __nv_bfloat162 scale = *reinterpret_cast<__nv_bfloat162*>(&scale_bits);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      __nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&w[j]), scale);
      w[j] = bf16x2_bits(v);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ---------------------------------------------------------------------------------------------
// Register-only expansion for the skinny kernel: 3 integer ops + one HMUL2 per bf16 pair (the
// float path above costs 6 per fp8 pair, 4.5 per e2m1 pair). The code's bits are placed straight
// into a bf16 pair whose exponent field is the code's own (E4M3: v * 2^-120, e2m1: v * 2^-126;
// subnormal codes land on bf16 subnormals with the same factor, zero on zero), and one HMUL2 by a
// power-of-two-scaled block/group scale makes the product exact (<= 6 significant bits, normal).
// NVFP4's scale pair is s * 2^(126 - kNvfp4AccShift) so that it stays below bf16's maximum; the
// kernel multiplies its fp32 sums by 2^kNvfp4AccShift (exact, a power of two).
constexpr int kNvfp4AccShift = 8;
// MXFP8 block exponents above this need 2^(S - 7) > 2^127: those chunks take decode_sub.
constexpr uint32_t kMxfp8FastMaxExp = 134;

template <uint32_t kSel>
__device__ __forceinline__ uint32_t prmt_sign(uint32_t lo, uint32_t hi) {
  // prmt's default mode: a selector nibble with bit 3 set replicates the chosen byte's sign bit.
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(lo), "r"(hi), "n"(kSel));
  return r;
}

// prmt_sign with the selector in a register (a per-thread byte choice): __byte_perm would ignore
// the sign-replicating bit 3 of each selector nibble.
__device__ __forceinline__ uint32_t prmt_reg(uint32_t lo, uint32_t hi, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
  return r;
}

// mxfp8 / fp8: pair[0] = bf16 pair of 2^(S - 7) (S = UE8M0 exponent; 127 for per-tensor fp8),
// S recoverable as (pair[0] & 0xFFFF) / 128 - 120 (also when S > kMxfp8FastMaxExp).
// nvfp4: the two group scales times 2^(126 - kNvfp4AccShift), as bf16 pairs.
struct FastScale {
  uint32_t pair[2] = {(127u + 120u) * 0x00800080u, 0u};
};

__device__ __forceinline__ uint32_t mx_fast_pair(uint32_t exponent) { return (exponent + 120u) * 0x00800080u; }
__device__ __forceinline__ uint32_t mx_exponent_of(uint32_t pair) { return ((pair & 0xFFFFu) >> 7) - 120u; }

// A chunk's FastScale from its scale bits: mxfp8 the UE8M0 byte, nvfp4 the two E4M3 group bytes
// (low byte: elements 0-15).
template <WeightKind F>
__device__ __forceinline__ FastScale fast_scale_of(uint32_t bits) {
  FastScale s;
  if constexpr (F == WeightKind::kMxfp8) {
    s.pair[0] = mx_fast_pair(bits & 0xFFu);
  } else if constexpr (F == WeightKind::kNvfp4) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(static_cast<uint16_t>(bits)));
    const float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
    const float mul = __int_as_float((127 + 126 - kNvfp4AccShift) << 23);  // 2^(126 - kNvfp4AccShift)
    const uint32_t ab = bf16x2_bits(__floats2bfloat162_rn(f.x * mul, f.y * mul));
    s.pair[0] = __byte_perm(ab, 0u, 0x1010);
    s.pair[1] = __byte_perm(ab, 0u, 0x3232);
  }
  return s;
}

// The scale bits of the chunk at element k0 of a scale row (global memory).
template <WeightKind F>
__device__ __forceinline__ FastScale load_fast_scale(const uint8_t* scale_row, int64_t k0) {
  if constexpr (F == WeightKind::kMxfp8) {
    return fast_scale_of<F>(__ldg(scale_row + k0 / 32));
  } else if constexpr (F == WeightKind::kNvfp4) {
    return fast_scale_of<F>(__ldg(reinterpret_cast<const uint16_t*>(scale_row + k0 / 16)));
  } else {
    return FastScale();
  }
}

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  return bf16x2_bits(__hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b)));
}

// Elements [8 s, 8 s + 8) of a chunk as four bf16 pairs (element order), for fp8 / mxfp8 chunks
// with exponent <= kMxfp8FastMaxExp and nvfp4 chunks (times 2^-kNvfp4AccShift).
template <WeightKind F>
__device__ __forceinline__ uint4 decode_sub_fast(const uint4& raw, int s, const FastScale& sc) {
  if constexpr (F == WeightKind::kBF16) {
    return raw;
  } else if constexpr (F == WeightKind::kFp8 || F == WeightKind::kMxfp8) {
    // Bytes b0 b1 -> [sx(b1) b1 sx(b0) b0]; << 4 puts each magnitude at bf16 bits 4-10 and a
    // sign-replicated byte's bit 11 at bit 15; the mask drops the rest.
    const uint32_t a = s == 0 ? raw.x : raw.z, b = s == 0 ? raw.y : raw.w;
    const uint32_t m = 0x87F087F0u;
    const uint32_t mul = sc.pair[0];
    return make_uint4(hmul2_bits((prmt_sign<0x9180>(a, 0u) << 4) & m, mul),
                      hmul2_bits((prmt_sign<0xB3A2>(a, 0u) << 4) & m, mul),
                      hmul2_bits((prmt_sign<0x9180>(b, 0u) << 4) & m, mul),
                      hmul2_bits((prmt_sign<0xB3A2>(b, 0u) << 4) & m, mul));
  } else {
    // Byte p holds elements 2p (low nibble) and 2p + 1. With a4 = a << 4 both nibbles sit at the
    // top of a byte (a4's byte p, a's byte p), so prmt builds [sx(n1) (n1 n0) sx(n0) (n0 x)]
    // and << 2 puts each magnitude at bf16 bits 6-8 and a sign at bit 15.
    const uint32_t a = s == 0 ? raw.x : s == 1 ? raw.y : s == 2 ? raw.z : raw.w;
    const uint32_t a4 = a << 4;
    const uint32_t m = 0x81C081C0u;
    const uint32_t mul = sc.pair[s >> 1];
    return make_uint4(hmul2_bits((prmt_sign<0xC480>(a4, a) << 2) & m, mul),
                      hmul2_bits((prmt_sign<0xD591>(a4, a) << 2) & m, mul),
                      hmul2_bits((prmt_sign<0xE6A2>(a4, a) << 2) & m, mul),
                      hmul2_bits((prmt_sign<0xF7B3>(a4, a) << 2) & m, mul));
  }
}

// The factors the fp32 dot product of a row takes: fp8's per-tensor scale, then the second-level
// NVFP4 scale (WeightView::out_mul, or out_div when set). Kernels that see a weight only through
// a copy of its factors (the streamed kernel's unit headers) keep this struct.
struct OutScale {
  float pre = 1.0f;  // fp8's per-tensor scale (1 for other kinds: v * 1 is v)
  float div = 0.0f;
  float mul = 1.0f;
  __device__ static OutScale of(const WeightView& w) {
    OutScale o;
    if (w.kind == WeightKind::kFp8 && w.scale != nullptr) o.pre = *reinterpret_cast<const float*>(w.scale);
    o.div = w.out_div;
    o.mul = w.out_mul;
    return o;
  }
  __device__ float apply(float v) const {
    v *= pre;
    return div != 0.0f ? v / div : v * mul;
  }
};

}  // namespace m3::cuda::detail
