#include "kernels/cpu/cpu_dequant.h"

#include "formats/rows.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/cpu/weight_decoders.h"

namespace m3::cpu {

namespace {

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void mxfp8_row(const uint8_t* codes, const uint8_t* scales, int64_t n,
                                                    float* dst) {
  const Mxfp8Decoder d;
  int64_t i = 0;
  for (; i + kMxfp8Block <= n; i += kMxfp8Block) {
    for (int j = 0; j < kMxfp8Block; j += 16) {
      __m256 v[2];
      d.decode16(codes + i + j, scales[i / kMxfp8Block], v);
      _mm256_storeu_ps(dst + i + j, v[0]);
      _mm256_storeu_ps(dst + i + j + 8, v[1]);
    }
  }
  if (i < n) mxfp8_row_to_f32(codes + i, scales + i / kMxfp8Block, n - i, dst + i);
}

template <bool kDivides>
__attribute__((target("avx2"))) void nvfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t n,
                                               float* dst, float divisor) {
  const Nvfp4Decoder<kDivides> d(divisor);
  int64_t i = 0;
  for (; i + kNvfp4Group <= n; i += kNvfp4Group) {
    __m256 v[2];
    d.decode16(packed + i / 2, scales[i / kNvfp4Group], v);
    _mm256_storeu_ps(dst + i, v[0]);
    _mm256_storeu_ps(dst + i + 8, v[1]);
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
        case WeightFormat::kNvfp4: {
          const float divisor = w.global_divisor != 0.0f ? w.global_divisor : 1.0f;
          const uint8_t* packed = w.weight.data_as<const uint8_t>() + r * stride;
          const uint8_t* scales = w.scale.data_as<const uint8_t>() + r * w.scale.dim(1);
          if (divisor != 1.0f)
            nvfp4_row<true>(packed, scales, in, dst, divisor);
          else
            nvfp4_row<false>(packed, scales, in, dst, divisor);
          break;
        }
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
