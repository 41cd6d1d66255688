// Host-side bulk conversions built on the element codecs: whole rows of a checkpoint format to
// fp32 (dequantization exactly per each format's definition), and fp32 rows to the formats (for
// tests, dummy weights and fixtures). Blocks run along the row; a row's last block may be partial.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "formats/bf16.h"
#include "formats/fp16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "formats/ue8m0.h"

namespace m3 {

inline constexpr int kMxfp8Block = 32;

// All 256 E4M3 bytes decoded once (the decode is exact, so the table is too).
inline const std::array<float, 256>& fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_decode(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

inline void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_decode(src[i]);
}

inline void fp16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_decode(src[i]);
}

inline void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_encode(src[i]);
}

// value = e4m3 * scale (scale 1: the plain decode).
inline void fp8_e4m3_to_f32(const uint8_t* src, float* dst, int64_t n, float scale = 1.0f) {
  const auto& t = fp8_e4m3_table();
  for (int64_t i = 0; i < n; ++i) dst[i] = t[src[i]] * scale;
}

// MXFP8: value = e4m3 * 2^(s - 127), one UE8M0 byte per 32 elements.
inline void mxfp8_row_to_f32(const uint8_t* codes, const uint8_t* scales, int64_t n, float* dst) {
  const auto& t = fp8_e4m3_table();
  for (int64_t b = 0; b * kMxfp8Block < n; ++b) {
    const float s = ue8m0_decode(scales[b]);
    const int64_t end = std::min<int64_t>(n, (b + 1) * kMxfp8Block);
    for (int64_t i = b * kMxfp8Block; i < end; ++i) dst[i] = t[codes[i]] * s;
  }
}

// The 16 E2M1 codes decoded (exact).
inline const std::array<float, 16>& e2m1_table() {
  static const std::array<float, 16> table = [] {
    std::array<float, 16> t{};
    for (int i = 0; i < 16; ++i) t[i] = e2m1_decode(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// NVFP4 first level: value = e2m1 * e4m3(scale), exact in fp32; 16 elements per scale byte.
// `divisor` (the second level, when not 1) divides each exact product: one rounding, as
// code * scale / global is defined.
inline void nvfp4_row_to_f32(const uint8_t* packed, const uint8_t* scales, int64_t n, float* dst,
                             float divisor = 1.0f) {
  const auto& t = fp8_e4m3_table();
  const auto& e2m1 = e2m1_table();
  const int64_t whole = n / kNvfp4Group * kNvfp4Group;
  for (int64_t g = 0; g < whole; g += kNvfp4Group) {
    const float s = t[scales[g / kNvfp4Group]];
    const uint8_t* bytes = packed + g / 2;
    float v[kNvfp4Group];
    for (int j = 0; j < kNvfp4Group / 2; ++j) {
      v[2 * j] = e2m1[bytes[j] & 0xf] * s;
      v[2 * j + 1] = e2m1[bytes[j] >> 4] * s;
    }
    if (divisor != 1.0f) {
      for (int j = 0; j < kNvfp4Group; ++j) v[j] /= divisor;
    }
    std::copy(v, v + kNvfp4Group, dst + g);
  }
  for (int64_t i = whole; i < n; ++i) {
    const uint8_t byte = packed[i >> 1];
    const uint8_t code = (i & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xf);
    const float v = e2m1[code] * t[scales[i / kNvfp4Group]];
    dst[i] = divisor != 1.0f ? v / divisor : v;
  }
}

// Quantizes a row to MXFP8 with the smallest power-of-two scale per 32 elements that keeps
// |x| / scale <= 448 (what MXFP8 writers do); codes round to nearest even.
inline void mxfp8_quantize_row(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b * kMxfp8Block < n; ++b) {
    const int64_t end = std::min<int64_t>(n, (b + 1) * kMxfp8Block);
    float amax = 0.0f;
    for (int64_t i = b * kMxfp8Block; i < end; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    uint8_t s = amax > 0 ? ue8m0_encode_ceil(amax / kFp8E4M3Max) : 127;
    scales[b] = s;
    const float sd = ue8m0_decode(s);
    for (int64_t i = b * kMxfp8Block; i < end; ++i) codes[i] = fp8_e4m3_encode(x[i] / sd);
  }
}

// Quantizes a row to NVFP4 weights: per 16 elements an E4M3 scale = amax / 6 (clamped to the
// E4M3 range, after multiplying by `global`, the second-level factor the dequantization divides
// by), codes round to nearest even. value ~= e2m1 * scale / global.
inline void nvfp4_quantize_row(const float* x, int64_t n, float global, uint8_t* packed,
                               uint8_t* scales) {
  for (int64_t i = 0; i < (n + 1) / 2; ++i) packed[i] = 0;
  for (int64_t g = 0; g * kNvfp4Group < n; ++g) {
    const int64_t end = std::min<int64_t>(n, (g + 1) * kNvfp4Group);
    float amax = 0.0f;
    for (int64_t i = g * kNvfp4Group; i < end; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    float s = std::fmin(std::fmax(amax / 6.0f * global, kNvfp4ScaleMin), kFp8E4M3Max);
    uint8_t sb = fp8_e4m3_encode(s);
    scales[g] = sb;
    const float sd = fp8_e4m3_decode(sb) / global;
    for (int64_t i = g * kNvfp4Group; i < end; ++i) {
      uint8_t c = e2m1_encode(x[i] / sd);
      packed[i >> 1] |= static_cast<uint8_t>((i & 1) ? c << 4 : c);
    }
  }
}

}  // namespace m3
