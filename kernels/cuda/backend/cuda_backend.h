// CudaBackend: ops/backend.h on one NVIDIA GPU (Hopper, sm_90a).
//
//   auto backend = make_cuda_backend();
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

// A backend on the current CUDA device. Throws m3::Error when none is usable. cuda_graphs: replay
// uniform decode steps from CUDA graphs (kernels/cuda/backend/cuda_graphs.h); false: every step
// launches its kernels one by one (--enforce-eager).
std::unique_ptr<Backend> make_cuda_backend(bool cuda_graphs = true);

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
