// FP8 E4M3 ("float8_e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
// 0x7f/0xff are NaN; largest finite 448; smallest subnormal 2^-9.
// Encoding: round to nearest, ties to even, saturating: |x| >= 448 (and +-inf) -> +-448.
// NaN -> 0x7f with the input's sign. -0 encodes as 0x80 (callers that need +0 normalise first).
#pragma once
#include <cstdint>

#include "formats/bits.h"

namespace m3 {

inline constexpr float kFp8E4M3Max = 448.0f;

// The encoding above in integer steps: the host's, and the reference the device's conversion
// instruction is checked against.
M3_HD uint8_t fp8_e4m3_encode_bits(float f) {
  uint32_t x = float_bits(f);
  uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7fu;
  if (ax >= 0x43e00000u) return sign | 0x7eu;  // >= 448
  uint32_t e = ax >> 23;
  if (e < 121) {  // below 2^-6, the smallest normal: subnormal steps of 2^-9
    if (e < 117) return sign;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t s = 141 - e;
    uint32_t h = mant >> s;
    uint32_t rem = mant & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint8_t>(sign | h);
  }
  uint32_t h = ((e - 120) << 3) | ((ax & 0x7fffffu) >> 20);
  uint32_t rem = ax & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (h & 1u))) ++h;
  return static_cast<uint8_t>(sign | h);
}

M3_HD float fp8_e4m3_decode_bits(uint8_t b) {
  uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  uint32_t e = (b >> 3) & 0xfu;
  uint32_t m = b & 0x7u;
  if (e == 0xf && m == 0x7) return bits_float(sign | 0x7fc00000u);
  if (e == 0) {
    float v = static_cast<float>(m) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 120) << 23) | (m << 20));
}

// On sm_89 and later devices the conversion instructions (round to nearest even, saturating to
// +-448) give the same bytes and values, checked over all 2^32 floats and all 256 bytes by
// tests/kernels_cuda/weight_decode_check, in a few instructions instead of a few dozen; NaN keeps
// the integer path (its sign and payload).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define M3_FP8_E4M3_CVT 1
#endif

M3_HD uint8_t fp8_e4m3_encode(float f) {
#ifdef M3_FP8_E4M3_CVT
  if ((float_bits(f) & 0x7fffffffu) <= 0x7f800000u) {
    unsigned short two;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "f"(f));
    return static_cast<uint8_t>(two & 0xffu);
  }
#endif
  return fp8_e4m3_encode_bits(f);
}

M3_HD float fp8_e4m3_decode(uint8_t b) {
#ifdef M3_FP8_E4M3_CVT
  if ((b & 0x7fu) != 0x7fu) {
    unsigned int two_halves;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(two_halves) : "h"(static_cast<unsigned short>(b)));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(static_cast<unsigned short>(two_halves & 0xffffu)));
    return f;
  }
#endif
  return fp8_e4m3_decode_bits(b);
}

// The fp32 value a saturating E4M3 round trip gives.
M3_HD float fp8_e4m3_round(float f) { return fp8_e4m3_decode(fp8_e4m3_encode(f)); }

}  // namespace m3
