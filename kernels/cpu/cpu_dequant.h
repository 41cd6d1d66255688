// Fast dequantization of weight rows for the CPU backend's linear layers: AVX2 versions of the
// hot formats (MXFP8, NVFP4, bf16), bit-identical to the reference dequantize_rows
// (model/weights.h), which every other case and machine uses. Tested against it in
// tests/kernels_cpu.
#pragma once
#include <cstdint>

#include "ops/weights.h"

namespace m3::cpu {

void dequantize_tile(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out);

}  // namespace m3::cpu
