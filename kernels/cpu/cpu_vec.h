// fp32 row primitives of the CPU reference's attention ops. Each has a portable loop and, on CPUs
// with AVX2, a vector form that computes the same bits: the same eight lanes in the same order,
// a multiply then an add (never a fused multiply-add: the AVX2 forms are compiled without FMA),
// the same final reduction. So a result depends on neither the machine nor the batch.
#pragma once
#include <cstdint>
#include <cstring>

#include "formats/bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace m3::cpu {

// sum of a[i] * b[i]: lane l (0..7) accumulates i = l mod 8 over the multiples of 8, the lanes
// reduce as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail adds in order.
float dot(const float* a, const float* b, int n);
// out[j] = dot(a, b[j], n) for j < 8, computed side by side: independent sums keep the adders
// busy where one dot's eight lanes wait on each other.
void dot8(const float* a, const float* const b[8], int n, float out[8]);
// y[i] += p * x[i].
void add_scaled(float p, const float* x, float* y, int n);
// y[i] += p[j] * x[j][i] for j = 0 .. 7 in order (eight add_scaled calls, y kept in registers).
void add_scaled8(const float* p, const float* const x[8], float* y, int n);

// The portable forms, which the dispatching ones above must equal bit for bit (tests).
float dot_portable(const float* a, const float* b, int n);
void add_scaled_portable(float p, const float* x, float* y, int n);

// Whether this CPU runs the AVX2 forms.
bool vec_avx2();

#if defined(__x86_64__)
// The AVX2 forms, inline for loops compiled for AVX2 themselves (call them only where
// vec_avx2()). target("avx2") without "fma": the compiler cannot contract the mul + add.

// (l0+l4, l1+l5, l2+l6, l3+l7), then (s0+s2) + (s1+s3): dot's lane reduction.
__attribute__((target("avx2"))) inline float reduce_lanes_avx2(__m256 lanes) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

__attribute__((target("avx2"))) inline float dot_avx2(const float* a, const float* b, int n) {
  __m256 lanes = _mm256_setzero_ps();
  const int n8 = n & ~7;
  for (int i = 0; i < n8; i += 8)
    lanes = _mm256_add_ps(lanes, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  float acc = reduce_lanes_avx2(lanes);
  for (int i = n8; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// out[j] = dot_avx2(a, b[j], n) for j < N, side by side (N independent chains of adds).
template <int N>
__attribute__((target("avx2"))) inline void dots_avx2(const float* a, const float* const* b, int n, float* out) {
  __m256 lanes[N];
  for (int j = 0; j < N; ++j) lanes[j] = _mm256_setzero_ps();
  const int n8 = n & ~7;
  for (int i = 0; i < n8; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    for (int j = 0; j < N; ++j) lanes[j] = _mm256_add_ps(lanes[j], _mm256_mul_ps(x, _mm256_loadu_ps(b[j] + i)));
  }
  for (int j = 0; j < N; ++j) {
    out[j] = reduce_lanes_avx2(lanes[j]);
    for (int i = n8; i < n; ++i) out[j] += a[i] * b[j][i];
  }
}

// y[i] += p[j] * x[j][i] for j = 0 .. N - 1 in order: add_scaled N times, with y in registers
// 64 elements at a time (the same products and sums, element by element, in the same order).
template <int N>
__attribute__((target("avx2"))) inline void add_scaled_rows_avx2(const float* p, const float* const* x, float* y,
                                                                int n) {
  int i = 0;
  for (; i + 64 <= n; i += 64) {
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_loadu_ps(y + i + 8 * c);
    for (int j = 0; j < N; ++j) {
      const __m256 pv = _mm256_set1_ps(p[j]);
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(pv, _mm256_loadu_ps(x[j] + i + 8 * c)));
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(y + i + 8 * c, acc[c]);
  }
  for (; i < n; ++i)
    for (int j = 0; j < N; ++j) y[i] += p[j] * x[j][i];
}

// dst[i] = the bf16 src[i] (2 bytes each, any alignment) as fp32, exactly.
__attribute__((target("avx2"))) inline void bf16_to_f32_avx2(const void* src, int64_t n, float* dst) {
  const uint8_t* bytes = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, 2);
    dst[i] = bf16_decode(h);
  }
}

// One NVFP4 group's 16 codes (8 bytes: element 2j is the low nibble of byte j, 2j+1 the high one)
// looked up in a 16-entry table held in two registers (entries 0-7 in `low`, 8-15 in `high`): a
// code's low 3 bits pick the lane, bit 3 the register. out[0]: elements 0-7, out[1]: 8-15.
__attribute__((target("avx2"))) inline void nvfp4_group_lookup_avx2(const uint8_t* codes8, __m256 low, __m256 high,
                                                                   __m256 out[2]) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes8));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
  const __m128i codes = _mm_unpacklo_epi8(lo, hi);  // 16 codes in element order
  for (int half = 0; half < 2; ++half) {
    const __m256i idx = _mm256_cvtepu8_epi32(half ? _mm_srli_si128(codes, 8) : codes);
    const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    out[half] = _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, idx), _mm256_permutevar8x32_ps(high, idx), bit3);
  }
}

__attribute__((target("avx2"))) inline void add_scaled_avx2(float p, const float* x, float* y, int n) {
  const __m256 pv = _mm256_set1_ps(p);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(pv, _mm256_loadu_ps(x + i))));
  for (; i < n; ++i) y[i] += p * x[i];
}
#endif

}  // namespace m3::cpu
