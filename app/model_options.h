// Command-line options shared by the commands that load and run a model (generate, score, ...):
// --model, --dtype, --kv-cache-dtype, --attention-config, --load-format, --num-layers,
// --max-model-len, --num-kv-blocks / --kv-cache-memory, --seed, --device. load_model() turns them
// into a MiniMaxM3 on the chosen backend and logs what it built (KV pool size and dtypes).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/minimax_m3.h"
#include "ops/backend.h"

namespace CLI {
class App;
}

namespace m3::app {

struct ModelOptions {
  std::string model_dir;
  std::string dtype = "auto";           // activations: auto (= bfloat16), bfloat16, float32
  std::string kv_cache_dtype = "auto";  // auto (= activation dtype), float32, bfloat16, fp8, nvfp4
  std::string attention_config;         // JSON: {"indexer_kv_dtype": ...}
  std::string load_format = "auto";     // auto | safetensors | dummy
  int num_layers = 0;                   // > 0: keep only the first layers
  int64_t max_model_len = 0;            // 0: min(max_position_embeddings, 8192)
  int64_t num_kv_blocks = 0;            // 0: from --kv-cache-memory or 2 x max_model_len
  std::string kv_cache_memory;          // e.g. 512MiB, 2GiB, or bytes
  uint64_t seed = 0;                    // dummy weights
  std::string device = "auto";          // auto (cuda when a usable GPU is present), cpu, cuda
  bool enforce_eager = false;           // cuda: no CUDA graphs for decode steps
};

void add_model_options(CLI::App& cmd, ModelOptions& options);

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
  int64_t max_model_len = 0;
};

LoadedModel load_model(const ModelOptions& options);

// The index-K dtype named by --attention-config ("" when absent); keys that cannot be honoured
// (indexer_decode_cp: true, unknown keys) fail with an error naming them (decision 7).
std::string indexer_kv_dtype(const std::string& attention_config);

// --device: "cpu" or "cuda" as given; "auto" is cuda when this build has the CUDA backend, a
// usable Hopper GPU is present and the activations are bfloat16 (the GPU's only activation
// dtype), else cpu. Throws m3::Error for other names, or for cuda without a usable GPU.
std::string resolve_device(const std::string& device, DType activation_dtype);
// The backend for a resolved device; for cuda the weights move to the GPU (uploaded in their
// stored formats; the host copy is released) and decode steps replay CUDA graphs unless
// enforce_eager.
std::unique_ptr<Backend> make_backend(const std::string& device, ModelWeights& weights, bool enforce_eager = false);
// KV blocks for --gpu-memory-utilization: utilization x total GPU memory, minus what is already
// in use (weights uploaded, other processes) and `reserve_bytes` for activations and scratch,
// divided into blocks of block_bytes. Throws m3::Error naming the option when nothing is left.
int64_t gpu_kv_blocks(double utilization, int64_t block_bytes, int64_t reserve_bytes);

// "512MiB", "2GiB", "1.5G", "4096" -> bytes; throws m3::Error naming the option otherwise.
int64_t parse_memory_size(const std::string& text, const std::string& option);

}  // namespace m3::app
