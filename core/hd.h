// M3_HD marks small functions (format codecs, layout arithmetic) that CUDA kernels and the
// CPU reference must share, so that both compute bit-identical results.
#pragma once
#if defined(__CUDACC__)
#define M3_HD __host__ __device__ __forceinline__
#else
#define M3_HD inline
#endif
