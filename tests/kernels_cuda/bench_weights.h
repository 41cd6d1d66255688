// Device weights for backend_check's benchmarks, which launch the linear kernels directly (timing
// only: constant codes, no reference), and the kernels' view of them.
#pragma once
#include <cstdint>

#include "kernels/cuda/backend/backend_kernels.h"
#include "ops/weights.h"

namespace m3::test {

// NVFP4 codes 0x5a (3 and -1) with group scale 0.5 and the compressed-tensors global divisor of
// M3.1's experts, or MXFP8 codes 0x38 (1.0) with block scale 2^-7; [out, in].
LinearWeight constant_weight(int64_t out, int64_t in, WeightFormat format);
// The kernels' view of a weight from constant_weight (NVFP4 or MXFP8).
cuda::detail::WeightView view_of(const LinearWeight& w);

}  // namespace m3::test
