#include "kernels/cpu/cpu_dequant.h"

#include <limits>

#include "formats/rows.h"
#include "kernels/cpu/cpu_vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace m3::cpu {

namespace {

#if defined(__x86_64__)
// Every E4M3 product below is exact in fp32 (4 significant bits times a power of two, or times an
// E4M3 scale), so a lane computes exactly what the scalar reference computes.
// E4M3 through F16C: (b & 0x80) << 8 | (b & 0x7f) << 7 is an fp16 whose value is the E4M3 value
// times 2^-8, normal and subnormal alike (both formats' fields line up under the shift), and
// fp16 -> fp32 is exact. Times 2^8 is then exact too, so times the UE8M0 scale rounds exactly
// as the reference's single product does. The NaN codes (S.1111.111) come out as +-480, which
// no E4M3 value is, and are replaced by NaN.
__attribute__((target("avx2,f16c"))) void mxfp8_row(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                                    float* dst) {
  const __m256i sign = _mm256_set1_epi16(0x80), magnitude = _mm256_set1_epi16(0x7f);
  const __m256 two8 = _mm256_set1_ps(256.0f), nan_alias = _mm256_set1_ps(480.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  int64_t i = 0;
  for (; i + kMxfp8Block <= n; i += kMxfp8Block) {
    const __m256 s = _mm256_set1_ps(ue8m0_decode(scales[i / kMxfp8Block]));
    for (int j = 0; j < kMxfp8Block; j += 16) {
      const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i + j)));
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                        _mm256_slli_epi16(_mm256_and_si256(b, magnitude), 7));
      for (int half = 0; half < 2; ++half) {
        const __m128i h8 = half ? _mm256_extracti128_si256(h, 1) : _mm256_castsi256_si128(h);
        const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h8), two8);
        const __m256 is_nan = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), nan_alias, _CMP_EQ_OQ);
        _mm256_storeu_ps(dst + i + j + 8 * half, _mm256_blendv_ps(_mm256_mul_ps(v, s), nan, is_nan));
      }
    }
  }
  if (i < n) mxfp8_row_to_f32(codes + i, scales + i / kMxfp8Block, n - i, dst + i);
}

// E2M1 through the 16-entry table in two registers (codes 0-7 positive, 8-15 negative), times the
// group scale.
__attribute__((target("avx2"))) void nvfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n,
                                               float* dst, float divisor) {
  const auto& e2m1 = e2m1_table();
  const auto& e4m3 = fp8_e4m3_table();
  const __m256 lo_table = _mm256_loadu_ps(e2m1.data());
  const __m256 hi_table = _mm256_loadu_ps(e2m1.data() + 8);
  const __m256 div = _mm256_set1_ps(divisor);
  const bool divides = divisor != 1.0f;
  int64_t i = 0;
  for (; i + kNvfp4Group <= n; i += kNvfp4Group) {
    const __m256 s = _mm256_set1_ps(e4m3[scales[i / kNvfp4Group]]);
    __m256 v[2];
    cpu::nvfp4_group_lookup_avx2(packed + i / 2, lo_table, hi_table, v);
    for (int half = 0; half < 2; ++half) {
      v[half] = _mm256_mul_ps(v[half], s);
      if (divides) v[half] = _mm256_div_ps(v[half], div);
      _mm256_storeu_ps(dst + i + 8 * half, v[half]);
    }
  }
  if (i < n) nvfp4_row_to_f32(packed + i / 2, scales + i / kNvfp4Group, n - i, dst + i, divisor);
}

#endif

}  // namespace

void dequantize_tile(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const bool fast = avx2 && w.weight.device() == Device::kCpu && w.weight.ndim() == 2 &&
                    row_begin >= 0 && row_begin <= row_end && row_end <= w.out_features &&
                    (w.format == WeightFormat::kMxfp8 ||
                     (w.format == WeightFormat::kNvfp4 && w.global_scale == 1.0f) ||
                     (w.format == WeightFormat::kNvfp4 && w.global_divisor != 0.0f) ||
                     (w.format == WeightFormat::kDense && w.weight.dtype() == DType::kBF16));
  if (fast) {
    const int64_t in = w.in_features, stride = w.weight.dim(-1);
    for (int64_t r = row_begin; r < row_end; ++r) {
      float* dst = out + (r - row_begin) * in;
      switch (w.format) {
        case WeightFormat::kMxfp8:
          mxfp8_row(w.weight.data_as<const uint8_t>() + r * stride,
                    w.scale.data_as<const uint8_t>() + r * w.scale.dim(1), in, dst);
          break;
        case WeightFormat::kNvfp4:
          nvfp4_row(w.weight.data_as<const uint8_t>() + r * stride,
                    w.scale.data_as<const uint8_t>() + r * w.scale.dim(1), in, dst,
                    w.global_divisor != 0.0f ? w.global_divisor : 1.0f);
          break;
        default:
          cpu::bf16_to_f32_avx2(w.weight.data_as<const uint16_t>() + r * stride, in, dst);
          break;
      }
    }
    return;
  }
#endif
  dequantize_rows(w, row_begin, row_end, out);
}

}  // namespace m3::cpu
