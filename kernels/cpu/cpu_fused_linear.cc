#include "kernels/cpu/cpu_fused_linear.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/weight_decoders.h"

namespace m3::cpu {

namespace {

#if defined(__x86_64__)
namespace avx2 {
#define M3_FUSED_TARGET "avx2,fma,f16c"
#include "kernels/cpu/fused_kernels.inc"
#undef M3_FUSED_TARGET
}  // namespace avx2

namespace avx512 {
#define M3_FUSED_TARGET "avx2,fma,f16c,avx512f"
#include "kernels/cpu/fused_kernels.inc"
#undef M3_FUSED_TARGET
}  // namespace avx512

// NVFP4 with AVX-512F: the 16 codes of a group index a whole 16-entry table in one permute (AVX2
// needs two permutes of 8 and a blend for each 8 codes). Without a divisor the table is E2M1's
// and the values are then multiplied by the scale as Nvfp4Decoder does; with one it is the row of
// nvfp4_divided_values for the group's scale, the values themselves. About 1.7x AVX2's rate on
// the small model's expert projections at one row (docs/cpu-backend.md).
template <bool kDivided>
struct Nvfp4Rows512 {
  const uint8_t* packed;
  const uint8_t* scales;
  int64_t stride, scale_stride;
  const float* e4m3;    // fp8_e4m3_table()
  const float* values;  // kDivided: nvfp4_divided_values
  __m512 table;
  __attribute__((target("avx512f"))) void operator()(int64_t j, int64_t i, __m256 v[2]) const {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + j * stride + i / 2));
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    // The zero-masking forms with every lane kept: GCC 12 warns that the plain forms' (and
    // _mm512_castps512_ps256's) undefined pass-through operand may be used uninitialized.
    constexpr __mmask16 kAll = 0xffff;
    const __m512i codes = _mm512_maskz_cvtepu8_epi32(kAll, _mm_unpacklo_epi8(lo, hi));
    const uint8_t scale = scales[j * scale_stride + i / kNvfp4Group];
    __m512 out;
    if constexpr (kDivided) {
      out = _mm512_maskz_permutexvar_ps(kAll, codes, _mm512_loadu_ps(values + 16 * scale));
    } else {
      out = _mm512_mul_ps(_mm512_maskz_permutexvar_ps(kAll, codes, table), _mm512_set1_ps(e4m3[scale]));
    }
    v[0] = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(out), 0));
    v[1] = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(out), 1));
  }
};

__attribute__((target("avx2,fma,f16c,avx512f"))) void nvfp4_tile_avx512(const float* x, int64_t rows, int64_t ldx,
                                                                        const LinearWeight& w, int64_t row_begin,
                                                                        int64_t row_end, float* out, int64_t ldo,
                                                                        const float* divided) {
  const int64_t n = row_end - row_begin, stride = w.weight.dim(-1), scale_stride = w.scale.dim(1);
  const uint8_t* packed = w.weight.data_as<const uint8_t>() + row_begin * stride;
  const uint8_t* scales = w.scale.data_as<const uint8_t>() + row_begin * scale_stride;
  const __m512 table = _mm512_loadu_ps(e2m1_table().data());
  if (divided != nullptr)
    avx512::fused(x, rows, ldx, n, w.in_features,
                  Nvfp4Rows512<true>{packed, scales, stride, scale_stride, fp8_e4m3_table().data(), divided, table},
                  out, ldo);
  else
    avx512::fused(x, rows, ldx, n, w.in_features,
                  Nvfp4Rows512<false>{packed, scales, stride, scale_stride, fp8_e4m3_table().data(), nullptr, table},
                  out, ldo);
}

__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const float* x, int64_t rows, int64_t ldx,
                                                        const LinearWeight& w, int64_t row_begin, int64_t row_end,
                                                        float* out, int64_t ldo, const float* divided) {
  const int64_t n = row_end - row_begin, in = w.in_features, stride = w.weight.dim(-1);
  switch (w.format) {
    case WeightFormat::kMxfp8: {
      const int64_t scale_stride = w.scale.dim(1);
      const Mxfp8Rows d{w.weight.data_as<const uint8_t>() + row_begin * stride,
                        w.scale.data_as<const uint8_t>() + row_begin * scale_stride, stride, scale_stride, {}};
      avx2::fused(x, rows, ldx, n, in, d, out, ldo);
      break;
    }
    case WeightFormat::kNvfp4: {
      const int64_t scale_stride = w.scale.dim(1);
      const uint8_t* packed = w.weight.data_as<const uint8_t>() + row_begin * stride;
      const uint8_t* scales = w.scale.data_as<const uint8_t>() + row_begin * scale_stride;
      if (divided != nullptr)
        avx2::fused(x, rows, ldx, n, in, Nvfp4DividedRows{packed, scales, stride, scale_stride, divided}, out, ldo);
      else
        avx2::fused(x, rows, ldx, n, in, Nvfp4Rows{packed, scales, stride, scale_stride, Nvfp4Decoder<false>(1.0f)},
                    out, ldo);
      break;
    }
    default:
      avx2::fused(x, rows, ldx, n, in, Bf16Rows{w.weight.data_as<const uint16_t>() + row_begin * stride, stride},
                  out, ldo);
      break;
  }
}
#endif  // __x86_64__

}  // namespace

void nvfp4_divided_table(const LinearWeight& w, float* values) {
#if defined(__x86_64__)
  nvfp4_divided_values(w.global_divisor, values);
#else
  (void)w, (void)values;
#endif
}

bool dequant_gemm_applies(int64_t rows, const LinearWeight& w) {
#if defined(__x86_64__)
  static const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return avx2 && rows >= 1 && rows <= kFusedMaxRows && w.in_features % kMxfp8Block == 0 &&
         w.weight.device() == Device::kCpu && w.weight.ndim() == 2 &&
         (w.format == WeightFormat::kMxfp8 ||
          (w.format == WeightFormat::kNvfp4 && (w.global_divisor != 0.0f || w.global_scale == 1.0f)) ||
          (w.format == WeightFormat::kDense && w.weight.dtype() == DType::kBF16));
#else
  (void)rows, (void)w;
  return false;
#endif
}

bool dequant_gemm_tile(const float* x, int64_t rows, int64_t ldx, const LinearWeight& w, int64_t row_begin,
                       int64_t row_end, float* out, int64_t ldo, const float* divided, bool allow_avx512) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool applies = dequant_gemm_applies(rows, w) && row_begin >= 0 && row_begin <= row_end &&
                       row_end <= w.out_features &&
                       !(w.format == WeightFormat::kNvfp4 && w.global_divisor != 0.0f && divided == nullptr);
  if (!applies) return false;
  const float* table = w.format == WeightFormat::kNvfp4 && w.global_divisor != 0.0f ? divided : nullptr;
  if (w.format == WeightFormat::kNvfp4 && avx512 && allow_avx512)
    nvfp4_tile_avx512(x, rows, ldx, w, row_begin, row_end, out, ldo, table);
  else
    tile_avx2(x, rows, ldx, w, row_begin, row_end, out, ldo, table);
  return true;
#else
  (void)x, (void)rows, (void)ldx, (void)w, (void)row_begin, (void)row_end, (void)out, (void)ldo, (void)divided,
      (void)allow_avx512;
  return false;
#endif
}

}  // namespace m3::cpu
