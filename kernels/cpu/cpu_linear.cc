#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_dequant.h"
#include "kernels/cpu/cpu_fused_linear.h"
#include "kernels/cpu/cpu_ops.h"

namespace m3::cpu {

namespace {
// One fixed order for every output: lane l accumulates fma(x[k], w[k], acc) for k = l mod 8 in
// ascending k over the whole multiples of 8, then reduce_fma_lanes. The AVX2 path and the
// portable path compute exactly this (fma rounds once either way).

#if defined(__x86_64__)
template <int R, int C>
__attribute__((target("avx2,fma"))) inline void block_avx2(const float* x, int64_t ldx, const float* w,
                                                           int64_t ldw, int64_t k, float* out, int64_t ldo) {
  const int64_t k8 = k & ~int64_t(7);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k8; i += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * ldx + i);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_loadu_ps(w + c * ldw + i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      alignas(32) float a[8];
      _mm256_store_ps(a, acc[r][c]);
      out[r * ldo + c] = reduce_fma_lanes(a, x + r * ldx, w + c * ldw, k8, k);
    }
}

#endif  // __x86_64__

inline void dot_portable(const float* x, const float* w, int64_t k, float* out) {
  const int64_t k8 = k & ~int64_t(7);
  float a[8] = {};
  for (int64_t i = 0; i < k8; i += 8)
    for (int l = 0; l < 8; ++l) a[l] = std::fma(x[i + l], w[i + l], a[l]);
  *out = reduce_fma_lanes(a, x, w, k8, k);
}

#if defined(__x86_64__)
template <int R>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, int64_t ldx, const float* w, int64_t ldw,
                                                   int64_t n, int64_t k, float* out, int64_t ldo) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) block_avx2<R, 4>(x, ldx, w + j * ldw, ldw, k, out + j, ldo);
  for (; j < n; ++j) block_avx2<R, 1>(x, ldx, w + j * ldw, ldw, k, out + j, ldo);
}
#endif  // __x86_64__
}  // namespace

void gemm_xwt(const float* x, int64_t rows, int64_t ldx, const float* w, int64_t n, int64_t k,
              int64_t ldw, float* out, int64_t ldo) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  constexpr bool avx2 = false;
#endif
  if (!avx2) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) dot_portable(x + r * ldx, w + j * ldw, k, out + r * ldo + j);
    return;
  }
#if defined(__x86_64__)
  // Panels of weight rows small enough to stay in L1/L2 while every input row passes over them.
  const int64_t panel = std::max<int64_t>(4, (int64_t(16) << 10) / std::max<int64_t>(k, 1) / 4 * 4);
  for (int64_t j0 = 0; j0 < n; j0 += panel) {
    const int64_t nj = std::min(panel, n - j0);
    int64_t r = 0;
    for (; r + 3 <= rows; r += 3) rows_avx2<3>(x + r * ldx, ldx, w + j0 * ldw, ldw, nj, k, out + r * ldo + j0, ldo);
    for (; r < rows; ++r) rows_avx2<1>(x + r * ldx, ldx, w + j0 * ldw, ldw, nj, k, out + r * ldo + j0, ldo);
  }
#endif
}

float* Scratch::thread_buffer(int thread, std::size_t floats) {
  if (per_thread_.size() <= static_cast<std::size_t>(thread)) per_thread_.resize(thread + 1);
  auto& b = per_thread_[thread];
  if (b.size() < floats) b.resize(floats);
  return b.data();
}

std::vector<float>& Scratch::shared(int slot, std::size_t floats) {
  if (shared_.size() <= static_cast<std::size_t>(slot)) shared_.resize(slot + 1);
  auto& b = shared_[slot];
  if (b.size() < floats) b.resize(floats);
  return b;
}

void linear(const float* x, int64_t rows, const LinearWeight& w, float* out, bool round_bf16,
            Scratch& scratch) {
  const int64_t in = w.in_features, out_features = w.out_features;
  if (rows == 0 || out_features == 0) return;
  M3_CHECK(w.weight.defined(), "linear {}: weight is not loaded", w.name);
  const bool direct = w.format == WeightFormat::kDense && w.weight.dtype() == DType::kF32 &&
                      w.weight.dim(-1) == in;
  // Tiles of ~8K weights: the dequantized tile (32 KB) stays in L1 while every input row passes.
  const int64_t tile = std::clamp<int64_t>((int64_t(1) << 13) / std::max<int64_t>(in, 1), 4, 512);
  const int64_t num_tiles = (out_features + tile - 1) / tile;
  const int threads = omp_get_max_threads();
  // A few rows (decode) multiply each weight once: decoded in registers as they are multiplied
  // (dequant_gemm_tile, the same bits), where the format allows.
  const bool fused = !direct && dequant_gemm_applies(rows, w);
  const bool divided = fused && w.format == WeightFormat::kNvfp4 && w.global_divisor != 0.0f;
  float* values = nullptr;
  if (divided) {
    values = scratch.shared(kLinearValuesSlot, kNvfp4DividedValues).data();
    nvfp4_divided_table(w, values);
  }
  for (int i = 0; i < threads; ++i) scratch.thread_buffer(i, direct ? 1 : tile * in);
  // Products under 64K multiply-adds run faster on one thread than through a parallel region; the
  // small model's expert projections at batch 1 (98K) already gain from two threads (its decode
  // step 3.4 -> 2.7 ms at 1K context on the 2-core machine, docs/cpu-backend.md).
  const bool parallel = num_tiles > 1 && rows * in * out_features >= (int64_t(1) << 16);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t i = 0; i < num_tiles; ++i) {
    const int64_t r0 = i * tile, r1 = std::min(out_features, r0 + tile);
    if (fused && dequant_gemm_tile(x, rows, in, w, r0, r1, out + r0, out_features, values)) continue;
    const float* wt;
    if (direct) {
      wt = w.weight.data_as<const float>() + r0 * in;
    } else {
      float* buf = scratch.thread_buffer(omp_get_thread_num(), 0);
      dequantize_tile(w, r0, r1, buf);
      wt = buf;
    }
    gemm_xwt(x, rows, in, wt, r1 - r0, in, in, out + r0, out_features);
  }
  if (round_bf16) {
    const int64_t n = rows * out_features;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_round(out[i]);
  }
}

float swiglu_oai(float gate, float up, float alpha, float limit, bool bf16) {
  const float g = std::min(gate, limit);
  const float u = std::clamp(up, -limit, limit);
  if (!bf16) {
    const float glu = g * (1.0f / (1.0f + std::exp(-(g * alpha))));
    return (u + 1.0f) * glu;
  }
  const float ga = bf16_round(g * alpha);
  const float sig = bf16_round(1.0f / (1.0f + std::exp(-ga)));
  const float glu = bf16_round(g * sig);
  return bf16_round(bf16_round(u + 1.0f) * glu);
}

void swiglu_mlp(const float* x, int64_t rows, const LinearWeight& gate, const LinearWeight& up,
                const LinearWeight& down, float alpha, float limit, float* out, bool bf16,
                Scratch& scratch) {
  const int64_t inter = gate.out_features;
  M3_CHECK(up.out_features == inter && down.in_features == inter,
           "MLP {}: gate/up/down shapes disagree ({} / {} / {})", gate.name, inter,
           up.out_features, down.in_features);
  // Slots 0-1 of the shared scratch belong to this function.
  float* g = scratch.shared(0, rows * inter).data();
  float* u = scratch.shared(1, rows * inter).data();
  linear(x, rows, gate, g, bf16, scratch);
  linear(x, rows, up, u, bf16, scratch);
  const int64_t n = rows * inter;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) g[i] = swiglu_oai(g[i], u[i], alpha, limit, bf16);
  linear(g, rows, down, out, bf16, scratch);
}

}  // namespace m3::cpu
