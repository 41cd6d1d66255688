// Shared pieces of the CUDA backend checks (backend_ops, backend_check): host data onto a backend
// and back (the same host inputs for the CPU reference and the CUDA backend), random data,
// quantized random weights in every WeightFormat, the backend configuration of a Geometry, error
// measures.
//
// The op checks speak the backend's own terms (ops/backend.h: BackendConfig, ops/weights.h) and
// need no model header; the whole-model checks (backend_model_check, graphs, latency) include
// model/ themselves.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/weights.h"

namespace m3::test {

// ---- host data onto a backend and back ----
// A tensor from backend.alloc() holding a copy of `host`'s bytes as they are (norm weights,
// embedding tables, KV pools, selections): ops that write it leave `host` as it was.
Tensor on_backend(Backend& backend, const Tensor& host);
// Activations [rows, cols] in the backend's storage dtype: the values rounded to bf16 (F32 on the
// CPU, BF16 bits on the GPU), so both backends start from the same numbers.
Tensor act_on_backend(Backend& backend, const std::vector<float>& values, int64_t rows, int64_t cols);
// A linear layer's tensors on the backend, formats, scales and scalar fields kept (the CPU
// backend reads the host structs as they are).
LinearWeight on_backend(Backend& backend, const LinearWeight& host);
MlpWeights on_backend(Backend& backend, const MlpWeights& host);
// Activations of any storage dtype as fp32 (Backend::copy_to_host_f32).
std::vector<float> read_act(Backend& backend, const Tensor& t);
std::vector<uint8_t> read_bytes(const Tensor& t);  // host or device, bytes as stored
// Fills every byte of t with `byte` (host or device): outputs an op must overwrite (0xff: NaN in
// bf16 and f32; 0x7f for selections: an id out of every range).
void poison(Tensor& t, uint8_t byte);
// Waits for every device stream (uploads by cudaMemcpy and the backends' own streams).
void sync_device();

// Device tensors without a backend (benchmarks): bytes as they are / BF16 activations.
Tensor to_device(const Tensor& host);
Tensor device_act(const std::vector<float>& values, int64_t rows, int64_t cols);

// ---- random data ----
// N(0, scale) values rounded to bf16.
std::vector<float> random_values(std::mt19937_64& rng, size_t n, float scale);
// F32 [n] of N(0, scale) values rounded to bf16 (norm weights).
Tensor random_f32(std::mt19937_64& rng, int64_t n, float scale);

// A random linear layer of `format` (dense dtype for kDense): values ~ N(0, 1/in) quantized the
// way checkpoints are; nvfp4_divisor selects compressed-tensors (> 0) or ModelOpt (0) NVFP4.
LinearWeight random_linear(std::mt19937_64& rng, const std::string& name, int64_t out, int64_t in,
                           WeightFormat format, DType dense_dtype = DType::kBF16,
                           float nvfp4_divisor = 0.0f);

// ---- backend configuration ----
// The geometry a backend is configured for in the op checks (sizes as given, RoPE tables as
// modeling_rope_utils, one MoE layer, sparse when index_dim > 0).
struct Geometry {
  std::string name;
  int hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int index_heads = 0, index_dim = 0, block_size = 0, topk = 0, local_blocks = 1, init_blocks = 0;
  int rotary_dim = 0;
  // The CUDA backend made with CudaBackendOptions::batch_invariant (cases_batch_invariance.cc).
  bool batch_invariant = false;
};
// Backend::configure for g with bf16 activations.
void configure(Backend& backend, const Geometry& g);

// ---- error measures ----
struct Error {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_abs / (max_ref > 0 ? max_ref : 1e-30); }
};
Error compare(const std::vector<float>& got, const std::vector<float>& want);

}  // namespace m3::test
