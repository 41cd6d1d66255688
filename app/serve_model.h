// What `m3serve serve` builds before it can answer: the model (weights loaded with a progress bar,
// KV pool sized from the memory budget), the engine over it, the tokenizer and chat template.
// Options that cannot be honoured on this machine fail here, before anything heavy, with a
// message naming the option (spec/README.md decision 7).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "app/model_options.h"
#include "engine/engine_core.h"
#include "model/minimax_m3.h"
#include "ops/backend.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace m3::app {

// vLLM options that describe the deployment rather than the model.
struct ServeEngineOptions {
  std::string device = "auto";  // auto | cpu | cuda
  int tensor_parallel_size = 1;
  std::optional<int> block_size;                 // must equal the model's index_block_size
  std::optional<double> gpu_memory_utilization;  // CUDA only
  std::string speculative_config;                // JSON
  std::string quantization_moe;                  // --quantization-config.moe
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  bool enable_prefix_caching = true;
};

// Checks that need no model files (device, parallelism, speculative decoding, attention config).
// Never touches the GPU driver: serve calls it before blocking SIGINT/SIGTERM in every thread.
// Throws m3::Error naming the option.
void check_deployment_options(const ServeEngineOptions& options, const ModelOptions& model_options);

struct ServingModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
  std::unique_ptr<EngineCore> engine;  // not started
};

// Loads config and weights (with a progress bar on stderr), checks the options that depend on
// the checkpoint (--block-size, --quantization-config.moe), resolves --device (auto: cuda when a
// usable GPU is present), moves the weights to the GPU there, sizes the KV pool (--num-kv-blocks,
// --kv-cache-memory; by default on the CPU room for --max-num-seqs full-length requests, at most
// 1 GiB, on the GPU what --gpu-memory-utilization (default 0.9) leaves after the weights and the
// activations of --max-num-batched-tokens) and builds the engine.
ServingModel load_serving_model(const ModelOptions& model_options,
                                const ServeEngineOptions& options);

// --chat-template: a file, or the template text itself; empty: the model's own (none is fine:
// chat requests then get a 400 that says so).
std::optional<text::ChatTemplate> load_chat_template(const std::string& setting,
                                                     const std::string& model_dir,
                                                     const text::Tokenizer& tokenizer);

}  // namespace m3::app
