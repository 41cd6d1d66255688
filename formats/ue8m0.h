// UE8M0: an unsigned power-of-two scale, value 2^(s-127); s = 255 is NaN. Used as the per-32
// block scale of MXFP8 weights (`weight_scale_inv`, a multiplier despite its name).
#pragma once
#include <cstdint>

#include "formats/bits.h"

namespace m3 {

M3_HD float ue8m0_decode(uint8_t s) {
  if (s == 0xff) return bits_float(0x7fc00000u);
  if (s == 0) return bits_float(0x00400000u);  // 2^-127 is an fp32 subnormal
  return bits_float(static_cast<uint32_t>(s) << 23);
}

// The smallest power of two >= x (x > 0, finite), clamped to the representable range
// [2^-127, 2^127]; what MXFP8 quantizers use so that x / scale never exceeds the element range.
M3_HD uint8_t ue8m0_encode_ceil(float x) {
  uint32_t u = float_bits(x) & 0x7fffffffu;
  if (u == 0) return 0;
  if (u >= 0x7f800000u) return 0xfe;
  int e;
  if (u < 0x00800000u) {
    // subnormal: 2^-127 covers up to 0x00400000, everything above needs 2^-126
    return u <= 0x00400000u ? 0 : 1;
  }
  e = static_cast<int>(u >> 23);  // biased exponent of x
  if (u & 0x7fffffu) ++e;
  return static_cast<uint8_t>(e > 254 ? 254 : e);
}

}  // namespace m3
