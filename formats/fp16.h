// IEEE binary16. Encoding rounds to nearest, ties to even, with subnormals; values of magnitude
// >= 65520 become infinity; NaN stays a quiet NaN with its sign.
#pragma once
#include <cstdint>

#include "formats/bits.h"

namespace m3 {

M3_HD uint16_t fp16_encode(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  uint32_t e = ax >> 23;
  if (ax < 0x38800000u) {  // below the smallest normal half, 2^-14
    if (e < 102) return sign;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t s = 126 - e;
    uint32_t h = mant >> s;
    uint32_t rem = mant & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((e - 112) << 10) | ((ax & 0x7fffffu) >> 13);
  uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

M3_HD float fp16_decode(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace m3
