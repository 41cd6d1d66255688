#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace m3::cpu {

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
  // Tiles of ~64K weights keep the dequantized tile in L2 and give every thread work.
  const int64_t tile = std::clamp<int64_t>((int64_t(1) << 16) / std::max<int64_t>(in, 1), 8, 512);
  const int64_t num_tiles = (out_features + tile - 1) / tile;
  const int threads = omp_get_max_threads();
  for (int i = 0; i < threads; ++i) scratch.thread_buffer(i, direct ? 1 : tile * in);
  // Small products (decode of small models) run faster on one thread than through a parallel region.
  const bool parallel = num_tiles > 1 && rows * in * out_features >= (int64_t(1) << 18);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t i = 0; i < num_tiles; ++i) {
    const int64_t r0 = i * tile, r1 = std::min(out_features, r0 + tile);
    const float* wt;
    if (direct) {
      wt = w.weight.data_as<const float>() + r0 * in;
    } else {
      float* buf = scratch.thread_buffer(omp_get_thread_num(), 0);
      dequantize_rows(w, r0, r1, buf);
      wt = buf;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(r1 - r0), static_cast<int>(in), 1.0f, x, static_cast<int>(in), wt,
                static_cast<int>(in), 0.0f, out + r0, static_cast<int>(out_features));
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
