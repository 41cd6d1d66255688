// Elementwise and normalisation kernels of the CUDA backend: RoPE tables, embedding, row gather,
// Gemma RMSNorm, per-head norm + RoPE, residual add (alone and fused with the next RMSNorm),
// bf16 -> fp32. Rounding follows the CPU reference op by op (see row_ops.cuh).
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/row_ops.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

__global__ void rope_tables_kernel(const int32_t* positions, int num_tokens, const float* inv_freq, int half,
                                   float factor, float* cos_out, float* sin_out) {
  kernel_prologue();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= num_tokens * half) return;
  const int t = i / half, j = i % half;
  const float f = __fmul_rn(static_cast<float>(positions[t]), inv_freq[j]);
  cos_out[i] = round_bf16(__fmul_rn(cosf(f), factor));
  sin_out[i] = round_bf16(__fmul_rn(sinf(f), factor));
}

__global__ void embed_kernel(const void* table, int table_dtype, int64_t rows, int64_t hidden, int64_t first_id,
                             const int32_t* ids, uint16_t* out) {
  kernel_prologue();
  const int t = blockIdx.x;
  const int64_t id = int64_t(ids[t]) - first_id;
  const int64_t row = id * hidden;
  uint16_t* y = out + int64_t(t) * hidden;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    if (id < 0 || id >= rows) {
      y[c] = 0;
    } else if (table_dtype == 0) {
      y[c] = static_cast<const uint16_t*>(table)[row + c];
    } else if (table_dtype == 1) {
      y[c] = f32_to_bf16_bits(static_cast<const float*>(table)[row + c]);
    } else {
      y[c] = f32_to_bf16_bits(__half2float(static_cast<const __half*>(table)[row + c]));
    }
  }
}

__global__ void gather_rows_kernel(const uint16_t* x, const int32_t* rows, int64_t cols, uint16_t* out) {
  kernel_prologue();
  const uint16_t* src = x + int64_t(rows[blockIdx.x]) * cols;
  uint16_t* dst = out + int64_t(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

// The sum of a CTA's per-thread doubles (one fixed order: warps, then the warp sums), on every thread.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double partial[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    double s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0;
    s = warp_sum(s);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  return partial[0];
}

// out = bf16((x * r) * (1 + w)) with r from the row's sum of squares, over the columns this thread owns.
__device__ __forceinline__ void norm_row(const uint16_t* xr, const float* w, int cols, float eps, double ss,
                                         uint16_t* yr) {
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / cols), eps)));
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    yr[c] = f32_to_bf16_bits(__fmul_rn(__fmul_rn(bf16_bits_to_f32(xr[c]), r), __fadd_rn(1.0f, w[c])));
}

// One CTA per row; the sum of squares in double as the reference.
__global__ void rms_norm_kernel(const uint16_t* x, const float* w, int cols, float eps, uint16_t* out) {
  kernel_prologue();
  const uint16_t* xr = x + int64_t(blockIdx.x) * cols;
  double ss = 0.0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const double v = bf16_bits_to_f32(xr[c]);
    ss += v * v;
  }
  norm_row(xr, w, cols, eps, block_sum(ss), out + int64_t(blockIdx.x) * cols);
}

// rms_norm_kernel over x += y in one pass: the same column-to-thread map and sum order, so the
// result is the add kernel's then the norm kernel's bit for bit. Each thread reads back only the
// columns it wrote, and reads y[c] before it writes out[c], so out may alias x or y.
__global__ void add_rms_norm_kernel(uint16_t* x, const uint16_t* y, const float* w, int cols, float eps,
                                    uint16_t* out) {
  kernel_prologue();
  uint16_t* xr = x + int64_t(blockIdx.x) * cols;
  const uint16_t* yr = y + int64_t(blockIdx.x) * cols;
  double ss = 0.0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const uint16_t sum = f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(xr[c]), bf16_bits_to_f32(yr[c])));
    xr[c] = sum;
    const double v = bf16_bits_to_f32(sum);
    ss += v * v;
  }
  norm_row(xr, w, cols, eps, block_sum(ss), out + int64_t(blockIdx.x) * cols);
}

// The two kernels above for rows of 16-byte chunks (cols % 8 == 0, 16-byte aligned rows): each
// thread loads its C chunks (8 columns each) with one vector load apiece before it sums, keeps
// them in registers for the scaling, and stores vectors. A row of M3's 6144 columns is one CTA of
// 768 threads with one chunk each, where the strided loops above take ~23 us at one row
// (dependent loads, a second pass over x). Same per-element arithmetic; the double sum runs in
// another order, as it already does against the CPU (each term is exact in double).
template <int C, bool kAdd>
__global__ void rms_norm_vec_kernel(uint16_t* x, const uint16_t* y, const float* w, int cols, float eps,
                                    uint16_t* out) {
  kernel_prologue();
  const int64_t base = int64_t(blockIdx.x) * cols;
  const int chunks = cols / 8;
  uint4 v[C];
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < chunks) v[j] = *reinterpret_cast<const uint4*>(x + base + 8 * c);
  }
  if constexpr (kAdd) {
    uint4 b[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int c = threadIdx.x + j * blockDim.x;
      if (c < chunks) b[j] = *reinterpret_cast<const uint4*>(y + base + 8 * c);
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int c = threadIdx.x + j * blockDim.x;
      if (c >= chunks) continue;
      uint32_t* aw = reinterpret_cast<uint32_t*>(&v[j]);
      const uint32_t* bw = reinterpret_cast<const uint32_t*>(&b[j]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float lo = __fadd_rn(bf16_bits_to_f32(uint16_t(aw[i])), bf16_bits_to_f32(uint16_t(bw[i])));
        const float hi = __fadd_rn(bf16_bits_to_f32(uint16_t(aw[i] >> 16)), bf16_bits_to_f32(uint16_t(bw[i] >> 16)));
        aw[i] = uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
      }
      *reinterpret_cast<uint4*>(x + base + 8 * c) = v[j];
    }
  }
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) continue;
    const uint32_t* aw = reinterpret_cast<const uint32_t*>(&v[j]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const double lo = bf16_bits_to_f32(uint16_t(aw[i])), hi = bf16_bits_to_f32(uint16_t(aw[i] >> 16));
      ss += lo * lo;
      ss += hi * hi;
    }
  }
  ss = block_sum(ss);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(ss / cols), eps)));
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) continue;
    const float4 w0 = *reinterpret_cast<const float4*>(w + 8 * c), w1 = *reinterpret_cast<const float4*>(w + 8 * c + 4);
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    const uint32_t* aw = reinterpret_cast<const uint32_t*>(&v[j]);
    uint4 o;
    uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __fmul_rn(__fmul_rn(bf16_bits_to_f32(uint16_t(aw[i])), r), __fadd_rn(1.0f, ws[2 * i]));
      const float hi = __fmul_rn(__fmul_rn(bf16_bits_to_f32(uint16_t(aw[i] >> 16)), r), __fadd_rn(1.0f, ws[2 * i + 1]));
      ow[i] = uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
    }
    *reinterpret_cast<uint4*>(out + base + 8 * c) = o;
  }
}

// Launches rms_norm_vec_kernel when the rows are 16-byte chunks; false: the caller takes the
// strided kernel.
template <bool kAdd>
bool launch_rms_norm_vec(uint16_t* x, const uint16_t* y, const float* w, int rows, int cols, float eps, uint16_t* out,
                         cudaStream_t stream) {
  const uintptr_t align = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y) |
                          reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(out);
  if (cols % 8 != 0 || align % 16 != 0) return false;
  const int chunks = cols / 8;
  const int threads = std::min(1024, (chunks + 31) / 32 * 32);
  const int per_thread = (chunks + threads - 1) / threads;
  auto go = [&](auto kernel) { launch_kernel(kernel, rows, threads, 0, stream, x, y, w, cols, eps, out); };
  switch (per_thread) {
    case 1: go(rms_norm_vec_kernel<1, kAdd>); return true;
    case 2: go(rms_norm_vec_kernel<2, kAdd>); return true;
    case 3:
    case 4: go(rms_norm_vec_kernel<4, kAdd>); return true;
    default: return false;
  }
}

__global__ void gather_rows_vec_kernel(const uint16_t* x, const int32_t* rows, int64_t cols, uint16_t* out) {
  kernel_prologue();
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(rows[blockIdx.x]) * cols);
  uint4* dst = reinterpret_cast<uint4*>(out + int64_t(blockIdx.x) * cols);
  for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) dst[c] = src[c];
}

// One warp per (token, head).
__global__ void head_norm_rope_kernel(const HeadNormRopeArgs a) {
  kernel_prologue();
  extern __shared__ float head_buf[];
  const int warp = threadIdx.x >> 5;
  const int item = blockIdx.x * (blockDim.x >> 5) + warp;
  if (item >= a.num_tokens * a.num_heads) return;
  const int t = item / a.num_heads;
  float* v = head_buf + warp * a.head_dim;
  uint16_t* row = a.x + int64_t(item) * a.head_dim;
  warp_head_norm_rope(row, row, v, a.head_dim, a.norm, a.eps, a.rope_dims, a.cos + int64_t(t) * a.rope_half,
                      a.sin + int64_t(t) * a.rope_half, a.rope_half);
}

__global__ void add_kernel(uint16_t* x, const uint16_t* y, int64_t n, bool vector) {
  kernel_prologue();
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (vector && i + 8 <= n) {
    uint4 a = *reinterpret_cast<const uint4*>(x + i);
    const uint4 b = *reinterpret_cast<const uint4*>(y + i);
    uint32_t* aw = reinterpret_cast<uint32_t*>(&a);
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(&b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = __fadd_rn(bf16_bits_to_f32(uint16_t(aw[j])), bf16_bits_to_f32(uint16_t(bw[j])));
      const float hi = __fadd_rn(bf16_bits_to_f32(uint16_t(aw[j] >> 16)), bf16_bits_to_f32(uint16_t(bw[j] >> 16)));
      aw[j] = uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
    }
    *reinterpret_cast<uint4*>(x + i) = a;
  } else {
    for (int64_t j = i; j < n && j < i + 8; ++j) x[j] = f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(x[j]), bf16_bits_to_f32(y[j])));
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* src, int64_t n, float* dst) {
  kernel_prologue();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = bf16_bits_to_f32(src[i]);
}

}  // namespace

cudaError_t launch_rope_tables(const int32_t* positions, int num_tokens, const float* inv_freq, int half,
                               float attention_factor, float* cos, float* sin, cudaStream_t stream) {
  const int n = num_tokens * half;
  if (n == 0) return cudaSuccess;
  launch_kernel(rope_tables_kernel, (n + 255) / 256, 256, 0, stream, positions, num_tokens, inv_freq, half, attention_factor,
                                                          cos, sin);
  return cudaGetLastError();
}

cudaError_t launch_embed(const void* table, int table_dtype, int64_t rows, int64_t hidden, int64_t first_id,
                         const int32_t* ids, int num_tokens, uint16_t* out, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  launch_kernel(embed_kernel, num_tokens, 256, 0, stream, table, table_dtype, rows, hidden, first_id, ids, out);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const uint16_t* x, const int32_t* rows, int n, int64_t cols, uint16_t* out,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (cols % 8 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) % 16 == 0)
    launch_kernel(gather_rows_vec_kernel, n, 256, 0, stream, x, rows, cols, out);
  else
    launch_kernel(gather_rows_kernel, n, 256, 0, stream, x, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const uint16_t* x, const float* w, int rows, int cols, float eps, uint16_t* out,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // Without the add the vector kernel neither reads y nor writes x.
  if (!launch_rms_norm_vec<false>(const_cast<uint16_t*>(x), nullptr, w, rows, cols, eps, out, stream))
    launch_kernel(rms_norm_kernel, rows, 256, 0, stream, x, w, cols, eps, out);
  return cudaGetLastError();
}

cudaError_t launch_add_rms_norm(uint16_t* x, const uint16_t* y, const float* w, int rows, int cols, float eps,
                                uint16_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!launch_rms_norm_vec<true>(x, y, w, rows, cols, eps, out, stream))
    launch_kernel(add_rms_norm_kernel, rows, 256, 0, stream, x, y, w, cols, eps, out);
  return cudaGetLastError();
}

cudaError_t launch_head_norm_rope(const HeadNormRopeArgs& a, cudaStream_t stream) {
  const int items = a.num_tokens * a.num_heads;
  if (items == 0) return cudaSuccess;
  constexpr int kWarps = 8;
  launch_kernel(head_norm_rope_kernel, (items + kWarps - 1) / kWarps, kWarps * 32, kWarps * a.head_dim * sizeof(float), stream, a);
  return cudaGetLastError();
}

cudaError_t launch_add(uint16_t* x, const uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t threads = (n + 7) / 8;
  const bool vector = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
  launch_kernel(add_kernel, static_cast<unsigned>((threads + 255) / 256), 256, 0, stream, x, y, n, vector);
  return cudaGetLastError();
}

cudaError_t launch_bf16_to_f32(const uint16_t* src, int64_t n, float* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  launch_kernel(bf16_to_f32_kernel, static_cast<unsigned>(blocks), 256, 0, stream, src, n, dst);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
