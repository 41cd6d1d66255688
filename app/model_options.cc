#include "app/model_options.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/cpu_backend.h"
#if M3SERVE_WITH_CUDA
#include "kernels/cuda/backend/cuda_backend.h"
#endif
#include "model/config.h"
#include "model/weights.h"

namespace m3::app {

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--model", o.model_dir, "model directory (config.json + safetensors)")->required();
  cmd.add_option("--dtype", o.dtype, "activation dtype: auto (bfloat16), bfloat16, float32")
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "KV cache dtype: auto (the activation dtype), float32, bfloat16, fp8, fp8_e4m3, nvfp4")
      ->capture_default_str();
  cmd.add_option("--attention-config", o.attention_config,
                 "JSON, e.g. '{\"indexer_kv_dtype\": \"nvfp4\"}' (index-K cache dtype; default: the KV dtype)");
  cmd.add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights)")
      ->capture_default_str();
  cmd.add_option("--num-layers", o.num_layers, "run only the first N layers");
  cmd.add_option("--max-model-len", o.max_model_len, "longest sequence (default min(config, 8192))");
  cmd.add_option("--num-kv-blocks", o.num_kv_blocks, "KV pool size in blocks");
  cmd.add_option("--kv-cache-memory", o.kv_cache_memory, "KV pool size in bytes (e.g. 2GiB)");
  cmd.add_option("--seed", o.seed, "seed of --load-format dummy weights");
  cmd.add_option("--device", o.device, "auto (cuda when a GPU is present), cpu or cuda")->capture_default_str();
  cmd.add_flag("--enforce-eager", o.enforce_eager,
               "cuda: launch every decode step's kernels one by one instead of replaying CUDA graphs");
}

std::string resolve_device(const std::string& device, DType activation_dtype) {
  M3_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--device '{}' (expected auto, cpu or cuda)",
           device);
  if (device == "cpu") return device;
#if M3SERVE_WITH_CUDA
  const CudaDeviceInfo gpu = cuda_device_info();
  const bool usable = gpu.available && gpu.compute_capability == 90;
  if (device == "auto") return usable && activation_dtype == DType::kBF16 ? "cuda" : "cpu";
  M3_CHECK(gpu.available, "--device cuda: no usable CUDA device (no GPU, or no driver)");
  M3_CHECK(usable, "--device cuda: {} (compute capability {}.{}) is not a Hopper GPU; the CUDA backend is built "
           "for sm_90a", gpu.name, gpu.compute_capability / 10, gpu.compute_capability % 10);
  M3_CHECK(activation_dtype == DType::kBF16,
           "--device cuda runs bfloat16 activations; --dtype {} is CPU-only (use --device cpu)",
           dtype_name(activation_dtype));
  return device;
#else
  (void)activation_dtype;
  M3_CHECK(device == "auto", "--device cuda: this m3serve was built without the CUDA backend (no nvcc at build time)");
  return "cpu";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& device, ModelWeights& weights, bool enforce_eager) {
  if (device == "cpu") return make_cpu_backend();
#if M3SERVE_WITH_CUDA
  M3_CHECK(device == "cuda", "unknown device '{}'", device);
  auto backend = make_cuda_backend(!enforce_eager);
  const auto t0 = std::chrono::steady_clock::now();
  weights = upload_weights_to_cuda(weights);
  M3_LOG_INFO("weights uploaded to the GPU in {:.2f} s",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return backend;
#else
  (void)weights;
  (void)enforce_eager;
  fail("device '{}' is not available in this build", device);
#endif
}

int64_t gpu_kv_blocks(double utilization, int64_t block_bytes, int64_t reserve_bytes) {
  M3_CHECK(utilization > 0 && utilization <= 1, "--gpu-memory-utilization must be in (0, 1], got {}", utilization);
#if M3SERVE_WITH_CUDA
  const CudaDeviceInfo gpu = cuda_device_info();
  M3_CHECK(gpu.available, "--gpu-memory-utilization: no usable CUDA device");
  const int64_t used = gpu.total_bytes - gpu.free_bytes;
  const int64_t budget = static_cast<int64_t>(utilization * static_cast<double>(gpu.total_bytes));
  const int64_t left = budget - used - reserve_bytes;
  const int64_t blocks = left > 0 ? left / block_bytes : 0;
  M3_CHECK(blocks > 0,
           "--gpu-memory-utilization {}: {:.1f} GiB of {:.1f} GiB, {:.1f} GiB already in use (weights, other "
           "processes) and {:.1f} GiB reserved for activations leave no room for a {}-byte KV block; raise it",
           utilization, budget / 1073741824.0, gpu.total_bytes / 1073741824.0, used / 1073741824.0,
           reserve_bytes / 1073741824.0, block_bytes);
  return blocks;
#else
  (void)block_bytes;
  (void)reserve_bytes;
  fail("--gpu-memory-utilization needs the CUDA backend, and this build has none");
#endif
}

int64_t parse_memory_size(const std::string& text, const std::string& option) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("{}: '{}' is not a size (e.g. 512MiB, 2GiB)", option, text);
  }
  const std::string unit = text.substr(used);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB" || unit == "KB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB" || unit == "MB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB" || unit == "GB") mult = 1024.0 * 1024 * 1024;
  else fail("{}: unknown unit '{}' in '{}' (use B, KiB, MiB or GiB)", option, unit, text);
  M3_CHECK(value > 0, "{}: size must be positive", option);
  return static_cast<int64_t>(value * mult);
}

std::string indexer_kv_dtype(const std::string& attention_config) {
  if (attention_config.empty()) return "";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(attention_config);
  } catch (const std::exception& e) {
    fail("--attention-config is not valid JSON: {}", e.what());
  }
  M3_CHECK(j.is_object(), "--attention-config must be a JSON object");
  std::string index;
  for (const auto& [key, value] : j.items()) {
    if (key == "indexer_kv_dtype") {
      M3_CHECK(value.is_string(), "--attention-config: indexer_kv_dtype must be a string");
      index = value.get<std::string>();
    } else if (key == "indexer_decode_cp") {
      M3_CHECK(value.is_boolean(), "--attention-config: indexer_decode_cp must be true or false");
      M3_CHECK(!value.get<bool>(),
               "--attention-config: indexer_decode_cp needs several GPUs; the CPU backend runs on one device");
    } else {
      fail("--attention-config: unsupported key '{}' (supported: indexer_kv_dtype, indexer_decode_cp)", key);
    }
  }
  return index;
}

LoadedModel load_model(const ModelOptions& o) {
  ModelConfig config = load_model_config(o.model_dir);
  if (o.num_layers > 0) override_num_layers(config, o.num_layers);

  ModelRuntimeOptions rt;
  rt.activation_dtype = parse_activation_dtype(o.dtype);
  rt.kv_dtype = resolve_kv_dtype(o.kv_cache_dtype, rt.activation_dtype);
  const std::string index = indexer_kv_dtype(o.attention_config);
  rt.index_dtype = index.empty() ? rt.kv_dtype : resolve_kv_dtype(index, rt.activation_dtype);
  const std::string device = resolve_device(o.device, rt.activation_dtype);

  const auto t0 = std::chrono::steady_clock::now();
  ModelWeights weights;
  if (o.load_format == "dummy") {
    weights = make_dummy_weights(config, o.seed);
  } else {
    M3_CHECK(o.load_format == "auto" || o.load_format == "safetensors",
             "--load-format '{}' (expected auto, safetensors or dummy)", o.load_format);
    weights = load_weights(config, o.model_dir);
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  LoadedModel m;
  m.max_model_len = o.max_model_len > 0 ? o.max_model_len
                                        : std::min<int64_t>(config.max_position_embeddings, 8192);
  std::vector<bool> sparse;
  for (AttentionKind kind : config.attention_kinds) sparse.push_back(kind == AttentionKind::kSparse);
  const KvLayout probe = KvLayout::make(config.index_block_size, config.num_kv_heads, config.head_dim,
                                        config.has_sparse_layers() ? config.index_head_dim : 0,
                                        rt.kv_dtype, rt.index_dtype, sparse);
  const int bs = config.index_block_size;
  if (o.num_kv_blocks > 0) {
    rt.num_kv_blocks = o.num_kv_blocks;
  } else if (!o.kv_cache_memory.empty()) {
    rt.num_kv_blocks = parse_memory_size(o.kv_cache_memory, "--kv-cache-memory") / probe.block_bytes;
    M3_CHECK(rt.num_kv_blocks > 0, "--kv-cache-memory {} holds no {}-byte block", o.kv_cache_memory,
             probe.block_bytes);
  } else {
    rt.num_kv_blocks = 2 * ((m.max_model_len + bs - 1) / bs);  // two sequences of max_model_len
  }
  m.backend = make_backend(device, weights, o.enforce_eager);
  m.model = std::make_unique<MiniMaxM3>(std::move(config), std::move(weights), *m.backend, rt);
  const MiniMaxM3& model = *m.model;
  M3_LOG_INFO("model {}: {} layers ({} sparse), hidden {}, vocab {}; weights {} in {:.2f} s", o.model_dir,
              model.config().num_layers, model.config().num_sparse_layers(), model.config().hidden_size,
              model.config().vocab_size, o.load_format == "dummy" ? "dummy" : "loaded", load_s);
  M3_LOG_INFO("backend {}: activations {}, KV {} (index {}); pool {} blocks x {} tokens = {} tokens, "
              "{} B/token, {:.1f} MiB; max model len {}",
              m.backend->name(), dtype_name(rt.activation_dtype), kv_dtype_name(rt.kv_dtype),
              kv_dtype_name(rt.index_dtype), rt.num_kv_blocks, model.block_size(),
              rt.num_kv_blocks * model.block_size(), model.kv_bytes_per_token(),
              model.kv_pool_bytes() / (1024.0 * 1024.0), m.max_model_len);
  return m;
}

}  // namespace m3::app
