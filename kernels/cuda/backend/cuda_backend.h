// CudaBackend: ops/backend.h on one NVIDIA GPU (Hopper, sm_90a).
//
//   auto backend = make_cuda_backend();  // CudaBackendOptions: graphs, --batch-invariant
//   ModelWeights w = place_weights(load_weights(config, dir), *backend);  // quantized stays quantized
//   MiniMaxM3 model(config, std::move(w), *backend, options);             // KV pool on the GPU
//
// Activations are bf16 on the device (activation_storage_dtype() == BF16) with fp32 accumulation;
// every op rounds where the CPU reference rounds in bf16 mode, so the two agree up to fp32
// summation order (docs/gpu-backend-notes.md lists every approximation). float32 activations are
// CPU-only. Weights are read in their stored formats and expanded in registers (never a
// dequantized copy). Attention uses the MSA kernels (kernels/cuda/msa.h) for the M3 shape
// (head_dim = index_dim = 128, 64-multiple blocks, bf16/fp8/nvfp4 caches) and exact generic
// kernels for any other geometry or a float32 cache.
//
// All ops run on the backend's own stream; copy_to_host_f32 is the only one that waits for it.
// Uniform decode steps (run_replayable) are recorded once per shape and replayed as CUDA graphs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ops/backend.h"

namespace m3 {

struct CudaDeviceInfo {
  bool available = false;
  std::string name;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int sm_count = 0;
  int compute_capability = 0;  // e.g. 90
};

// The current CUDA device, or available = false when no usable device or driver is present.
CudaDeviceInfo cuda_device_info();
// Visible CUDA devices (0 without a driver).
int cuda_device_count();
// Makes `device` the calling thread's current device (a rank's thread, before its backend exists).
void use_cuda_device(int device);

// How a CUDA backend runs its ops (the command line's --enforce-eager and --batch-invariant).
struct CudaBackendOptions {
  // Replay uniform decode steps from CUDA graphs (kernels/cuda/backend/cuda_graphs.h); false:
  // every step launches its kernels one by one (--enforce-eager).
  bool cuda_graphs = true;
  // --batch-invariant (vLLM's name): every reduction of a row (token) runs in an order fixed by
  // that row's own data and context length, never by the number of rows in the step, so a
  // request's outputs are bitwise the same alone, in any batch and under chunked prefill, as on
  // the CPU backend. Linears take fixed 16-row items of the skinny kernel (no split-K, no wgmma
  // tiles, bf16 weights not through cuBLASLt, whose algorithm depends on M), the MoE router its
  // decode-shaped kernel, MSA sparse attention the fewest slot splits and dense attention fixed
  // 256-block chunks (docs/gpu-backend-notes.md "Batch-invariant mode" lists each op and the cost).
  // One rank only: the loader refuses it with -tp / --data-parallel-size.
  bool batch_invariant = false;
};

// A backend on the current CUDA device. Throws m3::Error when none is usable.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// How a CUDA backend ran its replayable steps so far (zeros for any other backend): eagerly
// (first step of a shape, failed recordings, --enforce-eager excluded), recorded, replayed, and
// graphs dropped because scratch memory moved.
struct CudaGraphStats {
  int64_t eager = 0, captures = 0, replays = 0, capture_failures = 0, drops = 0;
};
CudaGraphStats cuda_graph_stats(const Backend& backend);
// The cudaStream_t a CUDA backend enqueues its ops on (null for any other backend): benchmarks time
// whole ops with events on it (an op may fork work to other streams; it joins them back first).
void* cuda_backend_stream(const Backend& backend);

}  // namespace m3
