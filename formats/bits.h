// Bit casts usable from host and device code.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace m3 {

M3_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

M3_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace m3
