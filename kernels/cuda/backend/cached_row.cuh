// Reading cached rows (K, V, index-K) on the device exactly as the CPU reference does
// (kernels/cpu/attention.cc cpu_kv_decode_row, dot), for the kernels that must agree with it bit
// for bit: the generic attention path and the indexer DCP kernels.
#pragma once
#include <cstdint>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "ops/kv_layout.h"

namespace m3::cuda::detail {

// Element i of a cached row, decoded as the reference does (Q8KV4 view for nvfp4 when e4m3_view).
__device__ __forceinline__ float cached_value(KvDType dtype, const uint8_t* data, const uint8_t* scales, int i,
                                              bool e4m3_view) {
  switch (dtype) {
    case KvDType::kF32:
      return reinterpret_cast<const float*>(data)[i];
    case KvDType::kBF16:
      return bf16_decode(reinterpret_cast<const uint16_t*>(data)[i]);
    case KvDType::kFP8:
      return fp8_e4m3_decode(data[i]);
    case KvDType::kNVFP4: {
      const uint8_t code = nvfp4_code_at(data, i);
      return e4m3_view ? nvfp4_value_e4m3(code, scales[i / kNvfp4Group]) : nvfp4_value(code, scales[i / kNvfp4Group]);
    }
  }
  return 0.0f;
}

// dot(q, row) in the order of the CPU reference's dot(): eight interleaved lanes (lane l takes
// i = l mod 8), the pairwise reduction ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in sequence;
// every multiply and add rounded on its own (no FMA contraction), so the result is its bits.
__device__ __forceinline__ float reference_dot(const float* q, KvDType dtype, const uint8_t* data,
                                               const uint8_t* scales, int n, bool e4m3_view) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const int n8 = n & ~7;
  for (int i = 0; i < n8; i += 8)
#pragma unroll
    for (int l = 0; l < 8; ++l)
      lane[l] = __fadd_rn(lane[l], __fmul_rn(q[i + l], cached_value(dtype, data, scales, i + l, e4m3_view)));
  float acc = __fadd_rn(__fadd_rn(__fadd_rn(lane[0], lane[4]), __fadd_rn(lane[2], lane[6])),
                        __fadd_rn(__fadd_rn(lane[1], lane[5]), __fadd_rn(lane[3], lane[7])));
  for (int i = n8; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(q[i], cached_value(dtype, data, scales, i, e4m3_view)));
  return acc;
}

}  // namespace m3::cuda::detail
