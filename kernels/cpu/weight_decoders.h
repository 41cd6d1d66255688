// Weight codes decoded into fp32 registers, 16 elements at a time, with AVX2: the CPU backend's
// tile dequantization (cpu_dequant.cc) and its fused products of few rows (cpu_fused_linear.cc)
// share these, so both hold the same values bit for bit, and each value is the scalar
// reference's (formats/rows.h: tests/kernels_cpu/linear_test.cc checks every code and scale
// byte). x86-64 only; call only where the CPU has AVX2 and F16C.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <limits>

#include "formats/rows.h"
#include "kernels/cpu/cpu_vec.h"

namespace m3::cpu {

// Every E4M3 product below is exact in fp32 (4 significant bits times a power of two, or times an
// E4M3 scale), so a lane computes exactly what the scalar reference computes.
// E4M3 through F16C: (b & 0x80) << 8 | (b & 0x7f) << 7 is an fp16 whose value is the E4M3 value
// times 2^-8, normal and subnormal alike (both formats' fields line up under the shift), and
// fp16 -> fp32 is exact. Times 2^8 is then exact too, so times the UE8M0 scale rounds exactly
// as the reference's single product does. The NaN codes (S.1111.111) come out as +-480, which
// no E4M3 value is, and are replaced by NaN. Where 16 codes hold no NaN code and 2^8 s is finite
// (scale bytes below 247), one product by 2^8 s gives the same bits: the fp16 value times 2^8 s is
// the E4M3 value times s, rounded once either way.

// UE8M0 scale bytes decoded once (ue8m0_decode's values).
inline const std::array<float, 256>& ue8m0_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = ue8m0_decode(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

struct Mxfp8Decoder {
  __m256i sign, magnitude;
  __m128i low7;
  __m256 two8, nan_alias, abs_mask, nan;
  const float* scale_values = ue8m0_table().data();
  __attribute__((target("avx2"))) Mxfp8Decoder()
      : sign(_mm256_set1_epi16(0x80)), magnitude(_mm256_set1_epi16(0x7f)), low7(_mm_set1_epi8(0x7f)),
        two8(_mm256_set1_ps(256.0f)), nan_alias(_mm256_set1_ps(480.0f)),
        abs_mask(_mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))),
        nan(_mm256_set1_ps(std::numeric_limits<float>::quiet_NaN())) {}
  // Codes [0, 16) times the block's scale (byte `scale`).
  __attribute__((target("avx2,f16c"))) void decode16(const uint8_t* codes, uint8_t scale, __m256 out[2]) const {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m256i b = _mm256_cvtepu8_epi16(raw);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(b, magnitude), 7));
    const bool nan_code = _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(raw, low7), low7)) != 0;
    if (scale < 247 && !nan_code) {
      const __m256 s8 = _mm256_set1_ps(scale_values[scale] * 256.0f);
      out[0] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s8);
      out[1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s8);
      return;
    }
    const __m256 s = _mm256_set1_ps(scale_values[scale]);
    for (int half = 0; half < 2; ++half) {
      const __m128i h8 = half ? _mm256_extracti128_si256(h, 1) : _mm256_castsi256_si128(h);
      const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h8), two8);
      const __m256 is_nan = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), nan_alias, _CMP_EQ_OQ);
      out[half] = _mm256_blendv_ps(_mm256_mul_ps(v, s), nan, is_nan);
    }
  }
};

// E2M1 through the 16-entry table in two registers (codes 0-7 positive, 8-15 negative), times the
// group scale, then divided by the compressed-tensors divisor where there is one (kDivides: the
// choice is made once for a tile, not in the loop).
template <bool kDivides>
struct Nvfp4Decoder {
  __m256 lo_table, hi_table, div;
  const float* scale_values = fp8_e4m3_table().data();
  __attribute__((target("avx2"))) explicit Nvfp4Decoder(float divisor)
      : lo_table(_mm256_loadu_ps(e2m1_table().data())), hi_table(_mm256_loadu_ps(e2m1_table().data() + 8)),
        div(_mm256_set1_ps(divisor)) {}
  // One group: 8 bytes of codes, scale byte `scale`.
  __attribute__((target("avx2"))) void decode16(const uint8_t* packed, uint8_t scale, __m256 out[2]) const {
    const __m256 s = _mm256_set1_ps(scale_values[scale]);
    cpu::nvfp4_group_lookup_avx2(packed, lo_table, hi_table, out);
    for (int half = 0; half < 2; ++half) {
      out[half] = _mm256_mul_ps(out[half], s);
      if constexpr (kDivides) out[half] = _mm256_div_ps(out[half], div);
    }
  }
};

// The NVFP4 values of a tensor with a compressed-tensors divisor, for every scale byte s and code c:
// values[16 s + c] = e2m1[c] * e4m3[s] / divisor, the reference's product and division (lane by
// lane, the same two roundings). A group's decode then looks its 16 values up in the row of its
// scale instead of dividing them: the division took ~40% of a fused projection's time.
__attribute__((target("avx2"))) inline void nvfp4_divided_values(float divisor, float* values) {
  const __m256 lo = _mm256_loadu_ps(e2m1_table().data()), hi = _mm256_loadu_ps(e2m1_table().data() + 8);
  const __m256 d = _mm256_set1_ps(divisor);
  for (int s = 0; s < 256; ++s) {
    const __m256 scale = _mm256_set1_ps(fp8_e4m3_table()[s]);
    _mm256_storeu_ps(values + 16 * s, _mm256_div_ps(_mm256_mul_ps(lo, scale), d));
    _mm256_storeu_ps(values + 16 * s + 8, _mm256_div_ps(_mm256_mul_ps(hi, scale), d));
  }
}

__attribute__((target("avx2"))) inline __m256 bf16x8(const uint16_t* src) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// A tile's weight rows as the fused products decode them: decode(j, i, v) puts elements i..i+15 of
// row j (counted from the tile's first) in v.
struct Mxfp8Rows {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t stride, scale_stride;
  Mxfp8Decoder d;
  __attribute__((target("avx2,f16c"))) void operator()(int64_t j, int64_t i, __m256 v[2]) const {
    d.decode16(codes + j * stride + i, scales[j * scale_stride + i / kMxfp8Block], v);
  }
};
struct Nvfp4Rows {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t stride, scale_stride;
  Nvfp4Decoder<false> d;
  __attribute__((target("avx2"))) void operator()(int64_t j, int64_t i, __m256 v[2]) const {
    d.decode16(packed + j * stride + i / 2, scales[j * scale_stride + i / kNvfp4Group], v);
  }
};
// With a divisor: each group's 16 values from the row of nvfp4_divided_values for its scale.
struct Nvfp4DividedRows {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t stride, scale_stride;
  const float* values;  // nvfp4_divided_values
  __attribute__((target("avx2"))) void operator()(int64_t j, int64_t i, __m256 v[2]) const {
    const float* row = values + 16 * scales[j * scale_stride + i / kNvfp4Group];
    cpu::nvfp4_group_lookup_avx2(packed + j * stride + i / 2, _mm256_loadu_ps(row), _mm256_loadu_ps(row + 8), v);
  }
};
struct Bf16Rows {
  const uint16_t* values;
  int64_t stride;
  __attribute__((target("avx2"))) void operator()(int64_t j, int64_t i, __m256 v[2]) const {
    v[0] = bf16x8(values + j * stride + i);
    v[1] = bf16x8(values + j * stride + i + 8);
  }
};

}  // namespace m3::cpu

#endif  // __x86_64__
