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

// e2m1_decode(e2m1_encode(x)): x rounded to the E2M1 value the encoder picks (zero and the small
// values +0, NaN 6), as compares and selects; the scale search rounds 96 values a group this way.
M3_HD float e2m1_round(float x) {
  const float a = fabsf(x);
  float m = 6.0f;  // saturates; NaN lands here too
  if (a <= 5.0f) m = 4.0f;
  if (a < 3.5f) m = 3.0f;
  if (a <= 2.5f) m = 2.0f;
  if (a < 1.75f) m = 1.5f;
  if (a <= 1.25f) m = 1.0f;
  if (a < 0.75f) m = 0.5f;
  if (a <= 0.25f) return 0.0f;
  return x < 0.0f ? -m : m;
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
// as the Q8KV4 kernels read it.
M3_HD float nvfp4_kv_group_error(const float* x, uint8_t sc) {
  const float sd = fp8_e4m3_decode(sc);
  float err = 0.0f;
  for (int i = 0; i < kNvfp4Group; ++i) {
    const float d = fp8_e4m3_round(e2m1_round(x[i] / sd) * sd) - x[i];
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
  const float sd = fp8_e4m3_decode(sc);
  for (int i = 0; i < kNvfp4Group / 2; ++i) {
    uint8_t lo = e2m1_encode(x[2 * i] / sd);
    uint8_t hi = e2m1_encode(x[2 * i + 1] / sd);
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
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
