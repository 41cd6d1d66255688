// Few rows of a linear layer with the weights decoded in registers as they are multiplied: a
// decode step multiplies each weight once, so there the decoding is the work, and dequantize_tile's
// round trip of the fp32 tile through memory a good part of the rest.
#pragma once
#include <cstdint>

#include "ops/weights.h"

namespace m3::cpu {

inline constexpr int64_t kFusedMaxRows = 3;

// Whether dequant_gemm_tile takes `rows` rows of x through w (given, for NVFP4 with a divisor,
// its nvfp4_divided_table).
bool dequant_gemm_applies(int64_t rows, const LinearWeight& w);

// The values an NVFP4 weight with a compressed-tensors divisor (global_divisor != 0) decodes to,
// for every scale byte and code (kNvfp4DividedValues floats; call only where dequant_gemm_tile
// can apply, i.e. on x86-64): what dequant_gemm_tile looks them up in instead of dividing.
inline constexpr int64_t kNvfp4DividedValues = 256 * 16;
void nvfp4_divided_table(const LinearWeight& w, float* values);

// out[r * ldo + j - row_begin] for r < rows and weight rows j in [row_begin, row_end): bit for
// bit what dequantize_tile followed by gemm_xwt gives. `divided`: w's nvfp4_divided_table where w
// is NVFP4 with a divisor, else unused. Returns false, doing nothing, where it does not apply:
// no AVX2 / FMA / F16C, more than kFusedMaxRows rows, in_features not a multiple of 32, NVFP4 with
// a divisor and no table, or a format or scale form dequantize_tile has no fast path for (the
// caller then takes the tile path). NVFP4 decodes with AVX-512F where the CPU has it and
// allow_avx512 (the tests run both).
bool dequant_gemm_tile(const float* x, int64_t rows, int64_t ldx, const LinearWeight& w, int64_t row_begin,
                       int64_t row_end, float* out, int64_t ldo, const float* divided, bool allow_avx512 = true);

}  // namespace m3::cpu
