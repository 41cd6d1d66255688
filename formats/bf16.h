// bfloat16: the top 16 bits of an IEEE fp32. Encoding rounds to nearest, ties to even; NaN stays
// a quiet NaN with its sign; overflow rounds to infinity as IEEE rounding does.
#pragma once
#include <cstdint>

#include "formats/bits.h"

namespace m3 {

M3_HD uint16_t bf16_encode(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

M3_HD float bf16_decode(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// The fp32 value nearest to f that bf16 can represent (what a cast to bf16 and back gives).
M3_HD float bf16_round(float f) { return bf16_decode(bf16_encode(f)); }

}  // namespace m3
