// CpuBackend: the reference implementation of ops/backend.h. Exact arithmetic (fp32 accumulation,
// weights dequantized on the fly tile by tile into fp32 scratch, OpenBLAS sgemm, OpenMP).
#pragma once
#include <memory>

#include "ops/backend.h"

namespace m3 {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace m3
