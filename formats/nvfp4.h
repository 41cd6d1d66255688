// NVFP4: E2M1 elements (values 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives; code 8 is -0) in groups
// of 16 sharing one E4M3 scale. Two codes per byte, the even element in the low nibble.
//
// KV-cache encoding (m3serve's own, docs/reference.md D4): per group of 16 along the head
// dimension, code = E2M1(x / scale) rounded to nearest, ties to even, saturating at +-6, and zero
// always +0 (never code 8), with the E4M3 scale searched: of the scale bytes E4M3(clamp(amax / 6,
// 2^-9, 448)) + step, step in {0, -1, 1, 2, 3, 4} (clamped to the positive finite codes; the
// first on a tie), the one whose decoded group, as the Q8KV4 readers see it (code * scale rounded
// to E4M3), is nearest the input in squared error. Larger steps trade the small elements' grid
// for the large ones landing on a code (4 instead of between 4 and 6): 1.3 dB more signal to
// noise than amax / 6 alone on Gaussian groups, which halved the small model's NVFP4 perplexity
// cost (almost all of it from K). The decoders do not change. No second-level scale.
//
// Weights (compressed-tensors `weight_packed` + `weight_scale` + `weight_global_scale`):
// value = e2m1 * e4m3(scale) / global. ModelOpt (`weight` + `weight_scale` + `weight_scale_2`):
// value = e2m1 * e4m3(scale) * scale_2.
#pragma once
#include <cmath>
#include <cstdint>

#include "formats/fp8_e4m3.h"

namespace m3 {

inline constexpr int kNvfp4Group = 16;
inline constexpr float kNvfp4ScaleMin = 1.0f / 512.0f;

M3_HD float e2m1_decode(uint8_t code) {
  // Branch-free table: magnitudes of codes 0..7 in units of 0.5.
  constexpr uint32_t kHalves = 0xC8643210u;  // nibbles: 0,1,2,3,4,6,8,12
  float mag = static_cast<float>((kHalves >> ((code & 7u) * 4u)) & 0xfu) * 0.5f;
  return (code & 8u) ? -mag : mag;
}

M3_HD uint8_t e2m1_encode(float x) {
  float a = fabsf(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;  // saturates; NaN lands here too
  if (c == 0) return 0;
  return static_cast<uint8_t>(c | (x < 0.0f ? 8u : 0u));
}

// The E4M3 scale byte amax / 6 of a KV group whose largest magnitude is amax: where the scale
// search starts.
M3_HD uint8_t nvfp4_kv_scale(float amax) {
  float s = amax / 6.0f;
  s = fminf(fmaxf(s, kNvfp4ScaleMin), kFp8E4M3Max);
  return fp8_e4m3_encode(s);
}

// An fp32 product that is never fused into an FMA, so the search's error sums are bit-identical
// on the host and the device (host builds target baseline x86-64 in ISO C++: no contraction).
M3_HD float nvfp4_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// The E2M1 grid at one scale sd: the midpoints between neighbouring magnitudes (0.25, 0.75, 1.25,
// 1.75, 2.5, 3.5, 5) times sd. Each product is exact in fp32 (a midpoint has at most 3 significant
// bits, an E4M3 scale 4), so comparing |x| against them rounds the exact quotient x / sd to the
// nearest magnitude without a division: the KV encoder's search rounds 96 values a candidate scale
// this way, branch-free on the device (a division there is a call with a slow path). The codes are
// e2m1_encode(x / sd)'s: the fp32 quotient never rounds onto or across a midpoint that the exact
// one is off (every float in [0.1, 6.5] x sd at all 126 positive scale bytes gives the same code;
// tests/formats sweeps the midpoints' neighbourhoods).
struct E2m1Bounds {
  float mid[7];
};
M3_HD E2m1Bounds e2m1_bounds(float sd) {
  return {{nvfp4_mul_rn(0.25f, sd), nvfp4_mul_rn(0.75f, sd), nvfp4_mul_rn(1.25f, sd), nvfp4_mul_rn(1.75f, sd),
           nvfp4_mul_rn(2.5f, sd), nvfp4_mul_rn(3.5f, sd), nvfp4_mul_rn(5.0f, sd)}};
}

// v[i] for the magnitude index i (0..7) nearest a / sd (a = |x|): a tie takes the even index (the
// midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 go to 0, 2, 2, 4, 4, 6, 6), past 5 index 7, and so
// does NaN. Selects, no branches or indexing (v stays in registers).
template <typename T>
M3_HD T e2m1_pick(const E2m1Bounds& b, float a, const T (&v)[8]) {
  T r = v[7];
  if (a <= b.mid[6]) r = v[6];
  if (a < b.mid[5]) r = v[5];
  if (a <= b.mid[4]) r = v[4];
  if (a < b.mid[3]) r = v[3];
  if (a <= b.mid[2]) r = v[2];
  if (a < b.mid[1]) r = v[1];
  if (a <= b.mid[0]) r = v[0];
  return r;
}

// e2m1_encode(x / sd) for b = e2m1_bounds(sd), without the division: zero always +0, NaN 7.
M3_HD uint8_t e2m1_encode_scaled(float x, const E2m1Bounds& b) {
  constexpr uint8_t kIndex[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const uint8_t c = e2m1_pick(b, fabsf(x), kIndex);
  return c == 0 ? 0 : static_cast<uint8_t>(c | (x < 0.0f ? 8u : 0u));
}

// The scale search's candidates: E4M3 code steps from the amax / 6 scale, in the order ties are
// settled (the first smallest error wins).
inline constexpr int kNvfp4ScaleCandidates = 6;
M3_HD int nvfp4_kv_scale_step(int k) { return k == 0 ? 0 : (k == 1 ? -1 : k - 1); }
// Candidate k's scale byte, from the amax / 6 byte `base`, kept among the positive finite codes.
M3_HD uint8_t nvfp4_kv_candidate(int base, int k) {
  const int code = base + nvfp4_kv_scale_step(k);
  return static_cast<uint8_t>(code < 0x01 ? 0x01 : (code > 0x7e ? 0x7e : code));
}

// Squared error, summed in element order, of x[0, 16) encoded with scale byte `sc` and read back
// as the Q8KV4 kernels read it (code * scale rounded to E4M3). |x| - level squares to the same
// fp32 value as x minus the signed level, so the levels are the 8 magnitudes' alone.
M3_HD float nvfp4_kv_group_error(const float* x, uint8_t sc) {
  const float sd = fp8_e4m3_decode(sc);
  const E2m1Bounds b = e2m1_bounds(sd);
  const float level[8] = {0.0f,
                          fp8_e4m3_round(nvfp4_mul_rn(0.5f, sd)),
                          sd,  // an E4M3 value already
                          fp8_e4m3_round(nvfp4_mul_rn(1.5f, sd)),
                          fp8_e4m3_round(nvfp4_mul_rn(2.0f, sd)),
                          fp8_e4m3_round(nvfp4_mul_rn(3.0f, sd)),
                          fp8_e4m3_round(nvfp4_mul_rn(4.0f, sd)),
                          fp8_e4m3_round(nvfp4_mul_rn(6.0f, sd))};
  float err = 0.0f;
  for (int i = 0; i < kNvfp4Group; ++i) {
    const float a = fabsf(x[i]);
    const float d = e2m1_pick(b, a, level) - a;
    err = err + nvfp4_mul_rn(d, d);
  }
  return err;
}

// The searched scale byte of a KV group (x[0, 16), largest magnitude amax).
M3_HD uint8_t nvfp4_kv_search_scale(const float* x, float amax) {
  const int base = nvfp4_kv_scale(amax);
  uint8_t best = static_cast<uint8_t>(base);
  float best_err = nvfp4_kv_group_error(x, best);
  for (int k = 1; k < kNvfp4ScaleCandidates; ++k) {
    const uint8_t code = nvfp4_kv_candidate(base, k);
    const float err = nvfp4_kv_group_error(x, code);
    if (err < best_err) best = code, best_err = err;
  }
  return best;
}

// Encodes 16 values: 8 packed bytes and one scale byte.
M3_HD void nvfp4_kv_encode_group(const float* x, uint8_t* packed, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < kNvfp4Group; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const uint8_t sc = nvfp4_kv_search_scale(x, amax);
  const E2m1Bounds b = e2m1_bounds(fp8_e4m3_decode(sc));
  for (int i = 0; i < kNvfp4Group / 2; ++i)
    packed[i] = static_cast<uint8_t>(e2m1_encode_scaled(x[2 * i], b) | (e2m1_encode_scaled(x[2 * i + 1], b) << 4));
  *scale = sc;
}

// Element i of a packed row.
M3_HD uint8_t nvfp4_code_at(const uint8_t* packed, int i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
}

// Exact fp32 value of one element (code * scale is exact in fp32).
M3_HD float nvfp4_value(uint8_t code, uint8_t scale) {
  return e2m1_decode(code) * fp8_e4m3_decode(scale);
}

// The Q8KV4 path's view of an element: code * scale rounded to E4M3 with saturation
// (docs/reference.md 3.1), as the vendor kernels compute on FP8 tensor cores.
M3_HD float nvfp4_value_e4m3(uint8_t code, uint8_t scale) {
  return fp8_e4m3_round(nvfp4_value(code, scale));
}

}  // namespace m3
