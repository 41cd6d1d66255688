// Internal building blocks of the CPU backend (not part of the backend interface): the exact
// linear layer over any weight format, the SwiGLU-OAI activation, and per-thread scratch.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/bf16.h"
#include "ops/weights.h"

namespace m3::cpu {

// Rounds to bf16 when the activations are bf16 (the Hugging Face model's rounding points).
inline float round_act(float x, bool bf16) { return bf16 ? bf16_round(x) : x; }

// Grow-only fp32 buffers, one per OpenMP thread plus named shared ones: after the first steps of
// a given size, the ops allocate nothing. Shared slots: 0-1 swiglu_mlp, 2-7 the MoE block
// (cpu_backend.cc), kLinearValuesSlot linear's NVFP4 value table.
inline constexpr int kLinearValuesSlot = 8;
class Scratch {
 public:
  float* thread_buffer(int thread, std::size_t floats);
  std::vector<float>& shared(int slot, std::size_t floats);

 private:
  std::vector<std::vector<float>> per_thread_;
  std::vector<std::vector<float>> shared_;
};

// The final sum of gemm_xwt's order: lanes a[0..7] (lane l accumulated fma(x[i], w[i]) for i = l
// mod 8 over the whole multiples of 8, k8 of them) summed pairwise, then the tail [k8, k) fused
// in ascending i.
inline float reduce_fma_lanes(const float a[8], const float* x, const float* w, int64_t k8, int64_t k) {
  float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
  for (int64_t i = k8; i < k; ++i) s = std::fma(x[i], w[i], s);
  return s;
}

// out[r][j] = sum_k x[r][k] w[j][k] (row strides ldx, ldw, ldo), fp32, batch-invariant: every
// output is summed in one fixed order that depends on k only, never on the number of rows or the
// row's position, so a request's logits do not change with the batch it runs in (BLAS GEMMs pick
// kernels and blockings by shape). Bit-identical on every x86-64 machine (AVX2+FMA or portable
// path: both fuse each multiply-add).
void gemm_xwt(const float* x, int64_t rows, int64_t ldx, const float* w, int64_t n, int64_t k,
              int64_t ldw, float* out, int64_t ldo);

// out [rows, w.out_features] = x [rows, w.in_features] W^T with W dequantized exactly
// (dequantize_tile), tile by tile of output rows into per-thread fp32 scratch (never a full
// copy), then gemm_xwt with fp32
// accumulation. Rounds the outputs to bf16 when round_bf16.
void linear(const float* x, int64_t rows, const LinearWeight& w, float* out, bool round_bf16,
            Scratch& scratch);

// SwiGLU-OAI of one element (docs/reference.md 2.5): g = min(gate, limit), u = clamp(up, +-limit),
// (u + 1) * g * sigmoid(alpha * g), with the Hugging Face model's op-by-op bf16 rounding when bf16.
float swiglu_oai(float gate, float up, float alpha, float limit, bool bf16);

// The SwiGLU-OAI MLP on rows of x: out [rows, hidden].
void swiglu_mlp(const float* x, int64_t rows, const LinearWeight& gate, const LinearWeight& up,
                const LinearWeight& down, float alpha, float limit, float* out, bool bf16,
                Scratch& scratch);

}  // namespace m3::cpu
