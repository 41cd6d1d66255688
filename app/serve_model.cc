#include "app/serve_model.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "engine/minimax_m3_runner.h"
#include "model/config.h"
#include "model/weights.h"

namespace m3::app {
namespace {

// A progress bar on a terminal; on a log file, one line per 10%.
class ConsoleProgress final : public LoadProgress {
 public:
  ConsoleProgress()
      : tty_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}

  void on_tensor(std::size_t done, std::size_t total) override {
    if (total == 0) return;
    const int percent = static_cast<int>(100 * done / total);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (tty_) {
      constexpr int kWidth = 40;
      const int filled = kWidth * percent / 100;
      std::fprintf(stderr, "\rloading weights [%s%s] %3d%% %zu/%zu tensors %.1fs",
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                   percent, done, total, seconds);
      if (done == total) std::fputc('\n', stderr);
      std::fflush(stderr);
    } else if (percent >= next_percent_ || done == total) {
      std::fprintf(stderr, "loading weights: %3d%% (%zu/%zu tensors, %.1fs)\n", percent, done,
                   total, seconds);
      next_percent_ = (percent / 10 + 1) * 10;
    }
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  int next_percent_ = 0;
};

// --attention-config for serving: the index-K dtype; indexer_decode_cp needs several GPUs.
std::string indexer_dtype_from(const std::string& attention_config) {
  if (attention_config.empty()) return "";
  nlohmann::json j = nlohmann::json::parse(attention_config, nullptr, false);
  M3_CHECK(!j.is_discarded() && j.is_object(), "--attention-config must be a JSON object, got '{}'",
           attention_config);
  std::string index;
  for (const auto& [key, value] : j.items()) {
    if (key == "indexer_kv_dtype") {
      M3_CHECK(value.is_string(), "--attention-config: indexer_kv_dtype must be a string");
      index = value.get<std::string>();
    } else if (key == "indexer_decode_cp") {
      M3_CHECK(value.is_boolean(), "--attention-config: indexer_decode_cp must be true or false");
      M3_CHECK(!value.get<bool>(),
               "--attention-config: indexer_decode_cp (indexer decode context "
               "parallelism) needs several GPUs and is not implemented yet; remove it");
    } else {
      fail(
          "--attention-config: unsupported key '{}' (supported: indexer_kv_dtype, "
          "indexer_decode_cp)",
          key);
    }
  }
  return index;
}

constexpr int64_t kDefaultCpuKvBytes = int64_t{1} << 30;
constexpr int64_t kDefaultModelLen = 8192;
constexpr double kDefaultGpuMemoryUtilization = 0.9;  // vLLM's default

// GPU memory a step takes beyond the weights and the KV pool, kept out of the KV budget: the
// model's activations for max_num_batched_tokens tokens (bf16: residual, norms, q/k/v, index-Q,
// attention output, MoE permuted rows and expert activations), the logits of max_num_seqs rows
// (bf16 and an f32 staging copy), and a fixed margin for the CUDA context, cuBLASLt's workspace
// and the MSA kernels' schedules.
int64_t gpu_activation_reserve_bytes(const ModelConfig& c, int max_tokens, int max_seqs) {
  const int64_t index = c.has_sparse_layers() ? int64_t(c.index_heads + 1) * c.index_head_dim : 0;
  const int64_t experts = int64_t(c.experts_per_token) * (c.moe_intermediate_size + c.hidden_size);
  const int64_t mlp = std::max<int64_t>(c.dense_intermediate_size, c.shared_intermediate_size + c.hidden_size) +
                      experts + 2 * c.num_experts;  // + fp32 router logits
  const int64_t per_token = 2 * (4 * int64_t(c.hidden_size) + 2 * int64_t(c.num_heads) * c.head_dim +
                                 2 * int64_t(c.num_kv_heads) * c.head_dim + index + mlp);
  const int64_t per_row = int64_t(c.vocab_size) * (2 + 4) + 2 * int64_t(c.hidden_size);
  return (int64_t{1} << 30) + per_token * max_tokens + per_row * max_seqs;
}

}  // namespace

void check_deployment_options(const ServeEngineOptions& o, const ModelOptions& mo) {
  M3_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
           "--device '{}' (expected auto, cpu or cuda)", o.device);
  M3_CHECK(o.tensor_parallel_size >= 1, "-tp/--tensor-parallel-size must be >= 1, got {}",
           o.tensor_parallel_size);
  M3_CHECK(o.tensor_parallel_size == 1,
           "-tp/--tensor-parallel-size {}: m3serve runs a model on a single device for now (tensor "
           "parallelism is not implemented); use -tp 1",
           o.tensor_parallel_size);
  // cpu: known without asking the driver (cmd_serve calls this before it blocks SIGTERM in every
  // thread, and the CUDA runtime starts threads of its own); auto and cuda: load_serving_model.
  M3_CHECK(!o.gpu_memory_utilization || o.device != "cpu",
           "--gpu-memory-utilization applies to GPU memory and --device cpu runs on the CPU "
           "backend; size the KV cache with --kv-cache-memory or --num-kv-blocks");
  if (!o.speculative_config.empty()) {
    nlohmann::json spec = nlohmann::json::parse(o.speculative_config, nullptr, false);
    M3_CHECK(!spec.is_discarded() && spec.is_object(),
             "--speculative-config must be a JSON object, got '{}'", o.speculative_config);
    std::string method = spec.value("method", "");
    fail(
        "--speculative-config: speculative decoding{} is not implemented in m3serve yet; remove "
        "--speculative-config",
        method.empty() ? "" : " (method '" + method + "')");
  }
  indexer_dtype_from(mo.attention_config);
  M3_CHECK(o.max_num_seqs >= 1, "--max-num-seqs must be >= 1, got {}", o.max_num_seqs);
  M3_CHECK(o.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1, got {}",
           o.max_num_batched_tokens);
}

ServingModel load_serving_model(const ModelOptions& mo, const ServeEngineOptions& o) {
  ModelConfig config = load_model_config(mo.model_dir);
  if (mo.num_layers > 0) override_num_layers(config, mo.num_layers);
  if (o.block_size) {
    M3_CHECK(
        *o.block_size == config.index_block_size,
        "--block-size {}: the KV block must be the model's MSA block (index_block_size = {} in "
        "{}/config.json); use --block-size {}",
        *o.block_size, config.index_block_size, mo.model_dir, config.index_block_size);
  }
  if (!o.quantization_moe.empty()) {
    const std::string stored(quant_scheme_name(config.quant.expert_scheme));
    M3_CHECK(o.quantization_moe == stored,
             "--quantization-config.moe {}: this checkpoint stores its routed experts as {}, and "
             "re-quantizing them at load time is not implemented",
             o.quantization_moe, stored);
  }

  ModelRuntimeOptions rt;
  rt.activation_dtype = parse_activation_dtype(mo.dtype);
  const std::string device = resolve_device(o.device, rt.activation_dtype);
  M3_CHECK(!o.gpu_memory_utilization || device == "cuda",
           "--gpu-memory-utilization applies to GPU memory and this server runs on the CPU "
           "backend{}; size the KV cache with --kv-cache-memory or --num-kv-blocks",
           o.device == "auto" ? " (no usable GPU found)" : "");
  rt.kv_dtype = resolve_kv_dtype(mo.kv_cache_dtype, rt.activation_dtype);
  const std::string index = indexer_dtype_from(mo.attention_config);
  rt.index_dtype = index.empty() ? rt.kv_dtype : resolve_kv_dtype(index, rt.activation_dtype);

  std::vector<bool> sparse;
  for (AttentionKind kind : config.attention_kinds)
    sparse.push_back(kind == AttentionKind::kSparse);
  const KvLayout layout = KvLayout::make(
      config.index_block_size, config.num_kv_heads, config.head_dim,
      config.has_sparse_layers() ? config.index_head_dim : 0, rt.kv_dtype, rt.index_dtype, sparse);
  // The longest request: --max-model-len, else the model's limit capped at 8192 tokens.
  const int64_t model_len =
      mo.max_model_len > 0 ? mo.max_model_len
                           : std::min<int64_t>(config.max_position_embeddings, kDefaultModelLen);
  if (mo.num_kv_blocks > 0) {
    rt.num_kv_blocks = mo.num_kv_blocks;
  } else if (!mo.kv_cache_memory.empty()) {
    rt.num_kv_blocks =
        parse_memory_size(mo.kv_cache_memory, "--kv-cache-memory") / layout.block_bytes;
    M3_CHECK(rt.num_kv_blocks > 0, "--kv-cache-memory {} holds no KV block ({} bytes each)",
             mo.kv_cache_memory, layout.block_bytes);
  } else if (device == "cuda") {
    rt.num_kv_blocks = 0;  // from --gpu-memory-utilization once the weights are on the GPU
  } else {
    // Enough for max_num_seqs full-length requests at once, within a CPU budget of 1 GiB.
    const int64_t blocks_per_request = (model_len + layout.block_size - 1) / layout.block_size;
    rt.num_kv_blocks = std::max<int64_t>(
        blocks_per_request,
        std::min(kDefaultCpuKvBytes / layout.block_bytes, o.max_num_seqs * blocks_per_request));
  }

  ModelWeights weights;
  if (mo.load_format == "dummy") {
    M3_LOG_INFO("building random (dummy) weights");
    weights = make_dummy_weights(config, mo.seed);
  } else {
    M3_CHECK(mo.load_format == "auto" || mo.load_format == "safetensors",
             "--load-format '{}' (expected auto, safetensors or dummy)", mo.load_format);
    ConsoleProgress progress;
    weights = load_weights(config, mo.model_dir, &progress);
  }

  ServingModel s;
  s.backend = make_backend(device, weights, mo.enforce_eager);  // cuda: the weights move to the GPU
  if (rt.num_kv_blocks == 0) {
    const double utilization = o.gpu_memory_utilization.value_or(kDefaultGpuMemoryUtilization);
    rt.num_kv_blocks = gpu_kv_blocks(
        utilization, layout.block_bytes,
        gpu_activation_reserve_bytes(config, o.max_num_batched_tokens, o.max_num_seqs));
    M3_LOG_INFO("--gpu-memory-utilization {}: {} KV blocks of {} bytes", utilization,
                rt.num_kv_blocks, layout.block_bytes);
  }
  s.model = std::make_unique<MiniMaxM3>(std::move(config), std::move(weights), *s.backend, rt);
  EngineConfig engine_config;
  engine_config.max_num_seqs = o.max_num_seqs;
  engine_config.max_num_batched_tokens = o.max_num_batched_tokens;
  engine_config.enable_prefix_caching = o.enable_prefix_caching;
  const MiniMaxM3& model = *s.model;
  const int64_t capacity = model.num_kv_blocks() * model.block_size();
  engine_config.max_model_len =
      static_cast<int>(mo.max_model_len > 0 ? model_len : std::min(model_len, capacity));
  s.engine =
      std::make_unique<EngineCore>(std::make_unique<MiniMaxM3Runner>(*s.model), engine_config);
  M3_LOG_INFO("model {}: {} layers ({} sparse), hidden {}, vocab {}; backend {}, activations {}",
              mo.model_dir, model.config().num_layers, model.config().num_sparse_layers(),
              model.config().hidden_size, model.config().vocab_size, s.backend->name(),
              dtype_name(rt.activation_dtype));
  M3_LOG_INFO(
      "KV cache: {} tokens ({} blocks of {}, KV {} / index {}, {} B/token, {:.1f} MiB); "
      "max model len {}, so up to {:.2f} full-length requests at once",
      s.engine->kv_capacity_tokens(), model.num_kv_blocks(), model.block_size(),
      kv_dtype_name(rt.kv_dtype), kv_dtype_name(rt.index_dtype), model.kv_bytes_per_token(),
      model.kv_pool_bytes() / (1024.0 * 1024.0), s.engine->max_model_len(),
      static_cast<double>(s.engine->kv_capacity_tokens()) / s.engine->max_model_len());
  return s;
}

std::optional<text::ChatTemplate> load_chat_template(const std::string& setting,
                                                     const std::string& model_dir,
                                                     const text::Tokenizer& tokenizer) {
  if (setting.empty()) {
    try {
      return text::ChatTemplate::load(model_dir);
    } catch (const m3::Error& e) {
      M3_LOG_WARN(
          "no chat template: {}; /v1/chat/completions will answer 400 (pass --chat-template)",
          e.what());
      return std::nullopt;
    }
  }
  std::string source = setting;
  std::string origin = "--chat-template";
  if (std::filesystem::is_regular_file(setting)) {
    std::ifstream in(setting);
    std::stringstream buffer;
    buffer << in.rdbuf();
    source = buffer.str();
    origin = setting;
  } else {
    M3_CHECK(setting.find("{{") != std::string::npos || setting.find("{%") != std::string::npos,
             "--chat-template '{}': no such file, and it does not look like a Jinja template",
             setting);
  }
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  const auto& tokens = tokenizer.special_tokens();
  if (tokens.bos) special["bos_token"] = *tokens.bos;
  if (tokens.eos) special["eos_token"] = *tokens.eos;
  if (tokens.pad) special["pad_token"] = *tokens.pad;
  if (tokens.unk) special["unk_token"] = *tokens.unk;
  return text::ChatTemplate(source, origin, std::move(special));
}

}  // namespace m3::app
