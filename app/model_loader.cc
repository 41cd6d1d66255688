#include "app/model_loader.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "app/capacity_plan.h"
#include "app/kv_offloading.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/minimax_m3_runner.h"
#include "engine/remote_copy_runner.h"
#include "kernels/cpu/cpu_backend.h"
#if M3SERVE_WITH_CUDA
#include "kernels/cuda/backend/cuda_backend.h"
#endif
#include "model/dspark.h"
#include "model/dummy_shard.h"
#include "model/weight_footprint.h"
#include "model/weight_shard.h"
#include "model/weights.h"
#include "parallel/gloo_communicator.h"
#include "parallel/host_address.h"
#include "parallel/tcp_store.h"
#if M3SERVE_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace m3::app {
namespace {

constexpr int64_t kDefaultModelLen = 8192;
constexpr int64_t kCpuKvBudgetBytes = int64_t{1} << 30;
constexpr double kDefaultGpuMemoryUtilization = 0.9;  // vLLM's default

// A progress bar on a terminal; on a log file, one line per 10%.
class ConsoleProgress final : public LoadProgress {
 public:
  ConsoleProgress() : tty_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}

  void on_tensor(std::size_t done, std::size_t total) override {
    if (total == 0) return;
    const int percent = static_cast<int>(100 * done / total);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (tty_) {
      constexpr int kWidth = 40;
      const int filled = kWidth * percent / 100;
      std::fprintf(stderr, "\rloading weights [%s%s] %3d%% %zu/%zu tensors %.1fs", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), percent, done, total, seconds);
      if (done == total) std::fputc('\n', stderr);
      std::fflush(stderr);
    } else if (percent >= next_percent_ || done == total) {
      std::fprintf(stderr, "loading weights: %3d%% (%zu/%zu tensors, %.1fs)\n", percent, done, total, seconds);
      next_percent_ = (percent / 10 + 1) * 10;
    }
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  int next_percent_ = 0;
};

// The directory of the DSpark drafter --speculative-config names: "model", else dspark/ beside the
// target's checkpoint.
std::filesystem::path dspark_dir(const SpeculativeConfig& spec, const ModelOptions& options) {
  return spec.model.empty() ? std::filesystem::path(options.model_dir) / "dspark" : std::filesystem::path(spec.model);
}

// The drafter's cache dtype: as asked, else bfloat16 on the GPU and float32 on the CPU (the
// activations' precision there).
KvDType dspark_cache_dtype(const SpeculativeConfig& spec, const std::string& device) {
  return spec.kv_cache_dtype.value_or(device == "cuda" ? KvDType::kBF16 : KvDType::kF32);
}

// Bytes of the DSpark drafter --speculative-config asks for: its share of each pool block (its
// cache), and what it holds beside the target's weights on the device: its files, its Markov
// heads widened to fp32, and under tensor parallelism (a vocab-parallel rank 0) whole copies of
// the embedding and lm_head (bf16); zeros without one.
struct DrafterBytes {
  int64_t per_block = 0, weights = 0;
};
DrafterBytes dspark_bytes(const ModelOptions& o, const EngineOptions& engine, const std::string& device, int block_size,
                          bool vocab_parallel) {
  const std::optional<SpeculativeConfig> spec = speculative_config(engine);
  DrafterBytes b;
  if (!spec || spec->method != "dspark" || o.load_format == "dummy") return b;
  const std::filesystem::path dir = dspark_dir(*spec, o);
  if (!std::filesystem::is_regular_file(dir / "config.json")) return b;  // attach_dspark names the problem
  const DSparkConfig c = load_dspark_config(dir);
  b.per_block = dspark_kv_layout(c, block_size, dspark_cache_dtype(*spec, device)).block_bytes;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") b.weights += static_cast<int64_t>(f.file_size());
  b.weights += 2 * int64_t(c.vocab_size) * c.markov_rank * 4;
  if (vocab_parallel) b.weights += 2 * int64_t(c.vocab_size) * c.hidden_size * 2;
  return b;
}

// KV blocks --gpu-memory-utilization leaves: utilization x total GPU memory, minus what is already
// in use (weights placed, other processes) and `reserve_bytes`, in blocks of block_bytes.
int64_t gpu_kv_budget_blocks(double utilization, int64_t block_bytes, int64_t reserve_bytes) {
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
  (void)utilization;
  (void)block_bytes;
  (void)reserve_bytes;
  fail("--gpu-memory-utilization needs the CUDA backend, and this build has none");
#endif
}

// The figures `m3serve plan` prints, for the layout this loader runs: the same weight footprint
// per rank, KV bytes per token and (on the GPU) activation reserve, and how many sequences of
// max-model-len tokens the pool it sized holds.
void log_plan(const ModelPlan& plan, int64_t pool_blocks, const EngineOptions& engine, int batched_tokens) {
  const ModelConfig& c = plan.config;
  const ParallelLayout& layout = plan.layout;
  const WeightFootprint weights = weight_footprint(c, layout.ranks.front());
  const KvTokenBytes token = kv_token_bytes(plan.kv_layout);
  const int64_t per_sequence = (plan.max_model_len + plan.kv_layout.block_size - 1) / plan.kv_layout.block_size;
  const std::string reserve =
      plan.device == "cuda"
          ? fmt::format(", activation reserve {:.2f} GB",
                        gpu_activation_reserve_bytes(c, layout, batched_tokens, engine.max_num_seqs) / 1e9)
          : "";
  M3_LOG_INFO("plan ({} rank{}, -tp {}{}{}): weights {:.2f} GB per rank, KV {} B + index-K {} B = {} B per token per "
              "rank{}; the pool holds {} sequences of {} tokens; step budget {} tokens",
              layout.config.world_size(), layout.config.world_size() == 1 ? "" : "s",
              layout.config.tensor_parallel_size,
              layout.attention_data_parallel() ? fmt::format(" x DEP {}", layout.config.data_parallel_size) : "",
              layout.config.enable_expert_parallel ? ", expert parallel" : "", weights.total() / 1e9, token.kv,
              token.index_k, token.total, reserve, pool_blocks / per_sequence, plan.max_model_len, batched_tokens);
}

// Before any weight is read: each rank's slice of the weights (model/weight_footprint.h, from
// config.json alone) plus the activation reserve must fit in --gpu-memory-utilization of its GPU.
void check_weights_fit_gpus(const ModelPlan& plan, const ModelOptions& o, const EngineOptions& engine,
                            int batched_tokens) {
#if M3SERVE_WITH_CUDA
  const CudaDeviceInfo gpu = cuda_device_info();
  if (!gpu.available) return;  // resolve_device has refused this already
  const double utilization = o.gpu_memory_utilization.value_or(kDefaultGpuMemoryUtilization);
  const int64_t budget = static_cast<int64_t>(utilization * static_cast<double>(gpu.total_bytes));
  const int64_t reserve =
      gpu_activation_reserve_bytes(plan.config, plan.layout, batched_tokens, engine.max_num_seqs);
  int64_t largest = 0;
  for (const RankShard& r : plan.layout.ranks) largest = std::max(largest, weight_footprint(plan.config, r).total());
  M3_CHECK(largest + reserve < budget,
           "{}: the weights need {:.1f} GB per rank with -tp {}{} (plus {:.1f} GB of activations for {} batched "
           "tokens), and each {} has {:.1f} GB under --gpu-memory-utilization {} ({:.1f} GB in all); use more GPUs "
           "(-tp), expert parallel, a smaller --max-num-batched-tokens, or `m3serve plan` to size a layout",
           o.model_dir, largest / 1e9, plan.layout.config.tensor_parallel_size,
           plan.layout.config.enable_expert_parallel ? " and expert parallel" : "", reserve / 1e9, batched_tokens,
           gpu.name, budget / 1e9, utilization, gpu.total_bytes / 1e9);
#else
  (void)plan;
  (void)o;
  (void)engine;
  (void)batched_tokens;
#endif
}

// The step budget on this process's device: a GPU's memory and name choose vLLM's default.
int local_batched_tokens(const EngineOptions& engine, const ModelPlan& plan) {
  int64_t gpu_memory = 0;
  std::string gpu_name;
#if M3SERVE_WITH_CUDA
  if (plan.device == "cuda") {
    const CudaDeviceInfo gpu = cuda_device_info();
    if (gpu.available) {
      gpu_memory = gpu.total_bytes;
      gpu_name = gpu.name;
    }
  }
#endif
  return engine.batched_tokens(plan.max_model_len, gpu_memory, gpu_name);
}

int cuda_device_count() {
#if M3SERVE_WITH_CUDA
  return m3::cuda_device_count();
#else
  return 0;
#endif
}

// The CPU backend is batch-invariant whatever the options (kernels/cpu/cpu_ops.h).
std::unique_ptr<Backend> make_device_backend(const std::string& device, const ModelOptions& o) {
  if (device == "cpu") return make_cpu_backend();
#if M3SERVE_WITH_CUDA
  M3_CHECK(device == "cuda", "unknown device '{}'", device);
  CudaBackendOptions options;
  options.cuda_graphs = !o.enforce_eager;
  options.batch_invariant = o.batch_invariant;
  return make_cuda_backend(options);
#else
  (void)o;
  fail("device '{}' is not available in this build", device);
#endif
}

// --quantization names the method that produced the checkpoint, as vLLM spells it; vLLM refuses a
// method other than the config's quant_method, and quantizes an unquantized checkpoint at load,
// which m3serve does not. ModelOpt NVFP4 checkpoints say "modelopt", which vLLM runs as
// "modelopt_fp4".
void check_quantization_method(const std::string& method, const QuantConfig& quant, const std::string& model_dir) {
  if (method.empty()) return;
  M3_CHECK(!quant.method.empty(),
           "--quantization {}: {} is not quantized (its config.json has no quantization_config), and quantizing "
           "weights at load time is not implemented; drop --quantization",
           method, model_dir);
  std::vector<std::string> accepted = {quant.method};
  const bool nvfp4 = quant.linear_scheme == QuantScheme::kNvfp4 || quant.expert_scheme == QuantScheme::kNvfp4;
  if (quant.method == "modelopt" && nvfp4) accepted.push_back("modelopt_fp4");
  if (std::find(accepted.begin(), accepted.end(), method) != accepted.end()) return;
  std::string names;
  for (const std::string& a : accepted) names += (names.empty() ? "'" : " or '") + a + "'";
  fail("--quantization {} does not match {}: its quantization_config says quant_method '{}' (pass {} or drop "
       "--quantization); converting weights to another method at load time is not implemented",
       method, model_dir, quant.method, names);
}

}  // namespace

void use_device(int device) {
#if M3SERVE_WITH_CUDA
  use_cuda_device(device);
#else
  fail("GPU {}: this build has no CUDA backend", device);
#endif
}

void check_model_options(const ModelOptions& o) {
  M3_CHECK(!o.model_dir.empty(), "no model given (--model DIR)");
  M3_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda", "--device '{}' (expected auto, cpu or cuda)",
           o.device);
  M3_CHECK(o.load_format == "auto" || o.load_format == "safetensors" || o.load_format == "dummy",
           "--load-format '{}' (expected auto, safetensors or dummy)", o.load_format);
  M3_CHECK(o.num_layers >= 0, "--num-layers must be >= 0, got {}", o.num_layers);
  M3_CHECK(o.max_model_len >= 0, "--max-model-len must be >= 0, got {}", o.max_model_len);
  M3_CHECK(o.num_kv_blocks >= 0, "--num-kv-blocks must be >= 0, got {}", o.num_kv_blocks);
  M3_CHECK(!o.gpu_memory_utilization || (*o.gpu_memory_utilization > 0 && *o.gpu_memory_utilization <= 1),
           "--gpu-memory-utilization must be in (0, 1], got {}", o.gpu_memory_utilization.value_or(0));
  M3_CHECK(!o.gpu_memory_utilization || o.device != "cpu",
           "--gpu-memory-utilization applies to GPU memory and --device cpu runs on the CPU backend; size the KV "
           "cache with --kv-cache-memory or --num-kv-blocks");
  check_parallel_config(o.parallel);
  // Several ranks sum their partial results in an all-reduce (and DEP copies exchange expert rows)
  // whose order the mode does not fix.
  M3_CHECK(!o.batch_invariant || (o.parallel.tensor_parallel_size == 1 && o.parallel.data_parallel_size == 1),
           "--batch-invariant runs the model on one rank; it does not go with -tp {} / --data-parallel-size {} (the "
           "ranks' all-reduce sums in an order the mode does not fix)",
           o.parallel.tensor_parallel_size, o.parallel.data_parallel_size);
  // Data-parallel copies run as DEP: each copy (of -tp ranks) schedules its own requests over its
  // attention weights, the routed experts shared out over all ranks.
  if (o.parallel.data_parallel_size > 1) {
    M3_CHECK(o.parallel.enable_expert_parallel,
             "--data-parallel-size {}: data-parallel copies run as DEP (data-parallel attention, experts shared out "
             "over every rank); add --enable-expert-parallel (independent whole-model copies are separate servers)",
             o.parallel.data_parallel_size);
  }
  M3_CHECK(o.nnodes >= 1, "--nnodes must be >= 1, got {}", o.nnodes);
  M3_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} outside [0, --nnodes {})", o.node_rank,
           o.nnodes);
  M3_CHECK(o.master_port > 0 && o.master_port < 65536, "--master-port {} is not a TCP port", o.master_port);
  M3_CHECK(o.node_timeout_s > 0, "--node-timeout must be > 0 seconds, got {}", o.node_timeout_s);
  if (o.nnodes > 1) {
    M3_CHECK(!o.master_addr.empty(),
             "--nnodes {}: the hosts meet at --master-addr (the address of node 0) and --master-port; give "
             "--master-addr",
             o.nnodes);
    const int dp = o.parallel.data_parallel_size, tp = o.parallel.tensor_parallel_size;
    if (dp > 1) {
      // DEP over hosts: each host holds whole copies (node 0 drives the others' over channels).
      M3_CHECK(dp % o.nnodes == 0,
               "--data-parallel-size {} is not a multiple of --nnodes {}: under DEP over several hosts every host "
               "holds the same number of whole copies (--data-parallel-size / --nnodes, each of -tp {} ranks)",
               dp, o.nnodes, tp);
    } else {
      M3_CHECK(tp % o.nnodes == 0,
               "-tp {} is not a multiple of --nnodes {}: every host runs the same number of ranks (-tp / --nnodes)", tp,
               o.nnodes);
    }
  }
  check_kv_offloading_backend(o.kv_offloading_backend);
  if (!o.kv_offloading_size.empty()) {
    parse_kv_offloading_size(o.kv_offloading_size);
  }
  const AttentionConfig attention = parse_attention_config(o.attention_config);
  M3_CHECK(!attention.indexer_decode_cp || o.parallel.tensor_parallel_size > 1,
           "--attention-config indexer_decode_cp: indexer decode context parallelism splits the index cache over the "
           "-tp ranks, and -tp is 1; use -tp 2 or more, or drop it");
}

void check_engine_options(const EngineOptions& o) {
  M3_CHECK(o.max_num_seqs >= 1, "--max-num-seqs must be >= 1, got {}", o.max_num_seqs);
  M3_CHECK(o.max_num_batched_tokens.value_or(1) >= 1, "--max-num-batched-tokens must be >= 1, got {}",
           o.max_num_batched_tokens.value_or(1));
  speculative_config(o);
}

std::optional<SpeculativeConfig> speculative_config(const EngineOptions& o) {
  if (o.speculative_config.empty()) return std::nullopt;
  SpeculativeConfig spec = parse_speculative_config(o.speculative_config);
  // Checked key by key first, so that a wrong key or value is named; then what m3serve's DSpark
  // drafter does not do yet.
  M3_CHECK(spec.method != "dspark" || !spec.kv_cache_dtype || *spec.kv_cache_dtype != KvDType::kNVFP4,
           "--speculative-config: kv_cache_dtype nvfp4: the DSpark drafter's cache holds float32, bfloat16 or fp8 "
           "({})",
           spec.summary());
  return spec;
}

int default_batched_tokens(int64_t gpu_memory_bytes, std::string_view gpu_name) {
  // vLLM (EngineArgs, OPENAI_API_SERVER): its PR 17885 measured the larger budget lowering an
  // A100's throughput, hence the name test.
  std::string name(gpu_name);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const bool large_gpu = gpu_memory_bytes >= (int64_t{70} << 30) && name.find("a100") == std::string::npos;
  return large_gpu ? 8192 : 2048;
}

int EngineOptions::batched_tokens(int64_t max_model_len, int64_t gpu_memory_bytes, std::string_view gpu_name) const {
  if (max_num_batched_tokens) return *max_num_batched_tokens;
  const int budget = default_batched_tokens(gpu_memory_bytes, gpu_name);
  if (enable_chunked_prefill) return budget;
  return static_cast<int>(std::clamp<int64_t>(max_model_len, budget, INT_MAX));
}

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--model", o.model_dir,
                 "model directory (config.json + safetensors), or a Hugging Face repo id (org/name)")
      ->required();
  add_hub_options(cmd, o.hub);
  cmd.add_option("--dtype", o.dtype, "activation dtype: auto (bfloat16), bfloat16, float32")->capture_default_str();
  cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "KV cache dtype: auto (the activation dtype), float32, bfloat16, fp8, fp8_e4m3, nvfp4")
      ->capture_default_str();
  cmd.add_option("--attention-config", o.attention_config,
                 "JSON, e.g. '{\"indexer_kv_dtype\": \"nvfp4\"}' (index-K cache dtype; default: the KV dtype)");
  cmd.add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights)")->capture_default_str();
  cmd.add_option("--num-layers", o.num_layers, "run only the first N layers");
  cmd.add_option("--max-model-len", o.max_model_len, "longest sequence (default min(config, 8192))");
  cmd.add_option("--num-kv-blocks", o.num_kv_blocks, "KV pool size in blocks");
  cmd.add_option("--kv-cache-memory", o.kv_cache_memory, "KV pool size in bytes (e.g. 2GiB)");
  cmd.add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                 "fraction of GPU memory for weights, activations and the KV pool (CUDA only; default 0.9 unless "
                 "--num-kv-blocks / --kv-cache-memory size the pool)");
  cmd.add_option("--kv-offloading-size", o.kv_offloading_size,
                 "GiB of host memory for the prefix cache's host tier: blocks evicted from the KV pool are copied "
                 "there and back on a hit (every rank's share together)");
  cmd.add_option("--kv-offloading-backend", o.kv_offloading_backend, "host tier backend: native (the only one)")
      ->capture_default_str();
  cmd.add_option("--block-size", o.block_size, "KV block size: must be the model's index_block_size");
  cmd.add_option("--quantization-config.moe", o.quantization_moe,
                 "MoE weight format; must match the checkpoint (no re-quantization)");
  cmd.add_option("--quantization,-q", o.quantization,
                 "the checkpoint's quantization method as vLLM names it (mxfp8, fp8, compressed-tensors, modelopt, "
                 "modelopt_fp4); must match its quantization_config (no quantization at load)");
  cmd.add_option("--seed", o.seed,
                 "seeds --load-format dummy weights and the sampling seeds of requests that give none (the same "
                 "seed and requests in the same order sample the same tokens)")
      ->capture_default_str();
  cmd.add_option("--device", o.device, "auto (cuda when a GPU is present), cpu or cuda")->capture_default_str();
  cmd.add_flag("--enforce-eager", o.enforce_eager,
               "cuda: launch every decode step's kernels one by one instead of replaying CUDA graphs");
  cmd.add_flag("--batch-invariant", o.batch_invariant,
               "cuda: kernels whose per-token sums do not depend on the batch, so that a request's outputs are "
               "bitwise the same alone, in any batch and under chunked prefill (slower; one rank only: not with -tp "
               "or --data-parallel-size > 1); cpu: a no-op, the CPU backend always is");
  cmd.add_option("-t,--tensor-parallel-size", o.parallel.tensor_parallel_size,
                 "ranks one model is split over (-tp N is accepted too): GPUs of this host, one per rank, or "
                 "threads on the CPU")
      ->capture_default_str();
  cmd.add_option("--data-parallel-size", o.parallel.data_parallel_size,
                 "model copies of -tp ranks each, each copy scheduling its own requests (data-parallel attention, "
                 "with --enable-expert-parallel: DEP; one host)")
      ->capture_default_str();
  cmd.add_flag("--enable-expert-parallel", o.parallel.enable_expert_parallel,
               "spread the routed experts whole over the ranks instead of splitting each expert's width");
  cmd.add_option("--nnodes", o.nnodes,
                 "hosts the -tp ranks are shared out over (-tp / --nnodes each; tensor / expert parallel only); "
                 "start the same command on every host, node 0 runs it and the others follow its steps")
      ->capture_default_str();
  cmd.add_option("--node-rank", o.node_rank, "this host's index among --nnodes (0: the one that runs the command)")
      ->capture_default_str();
  cmd.add_option("--master-addr", o.master_addr,
                 "address of node 0, where the hosts meet (each host's ranks listen on its interface that routes "
                 "there)");
  cmd.add_option("--master-port", o.master_port, "port node 0 listens on at --master-addr for the rendezvous")
      ->capture_default_str();
  cmd.add_option("--node-timeout", o.node_timeout_s,
                 "seconds a node waits for the others (start, collectives; a follower for node 0) before it fails")
      ->capture_default_str();
}

void add_engine_options(CLI::App& cmd, EngineOptions& o) {
  cmd.add_option("--max-num-seqs", o.max_num_seqs, "requests running at once")->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                 "tokens per engine step (default, as vLLM serve: 8192 on a GPU of 70 GiB or more other than an "
                 "A100, else 2048; with --no-enable-chunked-prefill at least --max-model-len)");
  cmd.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
               "reuse the KV of shared prompt prefixes (default on)");
  cmd.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", o.enable_chunked_prefill,
               "split long prompts into chunks under --max-num-batched-tokens (default on); off: a prompt is "
               "prefilled in one step, so --max-num-batched-tokens must be >= --max-model-len");
  cmd.add_option("--speculative-config", o.speculative_config,
                 "speculative decoding, JSON as vLLM's: method ngram (prompt_lookup_min, prompt_lookup_max) or dspark "
                 "(the drafter in dspark/ beside the model, or \"model\"), num_speculative_tokens, "
                 "rejection_sample_method standard|block|synthetic (synthetic_acceptance_length or _rates), "
                 "draft_sample_method greedy|probabilistic, kv_cache_dtype, attention_backend, disable_by_batch_size, "
                 "enable_adaptive_verification (docs/speculative-decoding.md)");
}

AttentionConfig parse_attention_config(const std::string& text) {
  AttentionConfig config;
  if (text.empty()) return config;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  M3_CHECK(!j.is_discarded() && j.is_object(), "--attention-config must be a JSON object, got '{}'", text);
  for (const auto& [key, value] : j.items()) {
    if (key == "indexer_kv_dtype") {
      M3_CHECK(value.is_string(), "--attention-config: indexer_kv_dtype must be a string");
      config.indexer_kv_dtype = value.get<std::string>();
    } else if (key == "indexer_decode_cp") {
      M3_CHECK(value.is_boolean(), "--attention-config: indexer_decode_cp must be true or false");
      config.indexer_decode_cp = value.get<bool>();
    } else {
      fail("--attention-config: unsupported key '{}' (supported: indexer_kv_dtype, indexer_decode_cp)", key);
    }
  }
  return config;
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

ModelPlan plan_model(const ModelOptions& o) {
  check_model_options(o);
  ModelPlan p;
  p.config = load_model_config(o.model_dir);
  if (o.num_layers > 0) override_num_layers(p.config, o.num_layers);
  const ModelConfig& c = p.config;
  if (o.block_size) {
    M3_CHECK(*o.block_size == c.index_block_size,
             "--block-size {}: the KV block must be the model's MSA block (index_block_size = {} in {}/config.json); "
             "use --block-size {}",
             *o.block_size, c.index_block_size, o.model_dir, c.index_block_size);
  }
  check_quantization_method(o.quantization, c.quant, o.model_dir);
  if (!o.quantization_moe.empty()) {
    const std::string stored(quant_scheme_name(c.quant.expert_scheme));
    M3_CHECK(o.quantization_moe == stored,
             "--quantization-config.moe {}: this checkpoint stores its routed experts as {}, and re-quantizing them "
             "at load time is not implemented",
             o.quantization_moe, stored);
  }
  p.runtime.activation_dtype = parse_activation_dtype(o.dtype);
  p.runtime.kv_dtype = resolve_kv_dtype(o.kv_cache_dtype, p.runtime.activation_dtype);
  const AttentionConfig attention = parse_attention_config(o.attention_config);
  p.runtime.index_dtype = attention.indexer_kv_dtype.empty()
                              ? p.runtime.kv_dtype
                              : resolve_kv_dtype(attention.indexer_kv_dtype, p.runtime.activation_dtype);
  p.device = resolve_device(o.device, p.runtime.activation_dtype);
  M3_CHECK(!o.gpu_memory_utilization || p.device == "cuda",
           "--gpu-memory-utilization applies to GPU memory and this model runs on the CPU backend{}; size the KV "
           "cache with --kv-cache-memory or --num-kv-blocks",
           o.device == "auto" ? " (no usable GPU found)" : "");
  p.attention = attention;
  p.layout = make_parallel_layout(o.parallel, model_geometry(c));  // a -tp that does not divide fails here
  p.kv_layout = kv_layout_for(c, p.runtime.kv_dtype, p.runtime.index_dtype,
                              static_cast<int>(p.layout.ranks.front().kv_heads.size));
  if (p.device == "cuda") {
    const int gpus = cuda_device_count();
    const int here = p.layout.config.world_size() / o.nnodes;
    M3_CHECK(here <= gpus, "-tp {}{}: one rank per GPU, {} on this host, and it has {} usable CUDA device{}",
             p.layout.config.world_size(), o.nnodes > 1 ? fmt::format(" over --nnodes {}", o.nnodes) : "", here,
             gpus, gpus == 1 ? "" : "s");
  }
  p.max_model_len = o.max_model_len > 0 ? o.max_model_len : std::min<int64_t>(c.max_position_embeddings, kDefaultModelLen);
  return p;
}

namespace {

// What a process of a deployment on several hosts holds while it loads (all empty on one host).
struct NodeRendezvous {
  std::unique_ptr<TcpStoreServer> server;  // node 0's, at --master-port
  std::shared_ptr<TcpStore> store;         // every node's client of it
  GlooOptions gloo;                        // where this host's ranks listen; the collectives' timeout
  std::unique_ptr<ControlGroup> control;
};

// Node 0 opens the store, every node connects to it and joins the control group (node R is its
// rank R). One timeout, --node-timeout, bounds every wait for another node.
NodeRendezvous meet_nodes(const ModelOptions& o) {
  NodeRendezvous n;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.node_timeout_s * 1000));
  if (o.node_rank == 0) n.server = std::make_unique<TcpStoreServer>("0.0.0.0", o.master_port);
  M3_LOG_INFO("node {} of {}: meeting the other nodes at {}:{}", o.node_rank, o.nnodes, o.master_addr, o.master_port);
  n.store = TcpStore::connect(o.master_addr, o.master_port, timeout);
  n.gloo.hostname = local_address_towards(o.master_addr, o.master_port);
  n.gloo.timeout = timeout;
  GlooRendezvous rendezvous = GlooRendezvous::tcp(n.store);
  n.control = std::make_unique<ControlGroup>(connect_gloo(rendezvous, o.node_rank, o.nnodes, "control", n.gloo),
                                             timeout);
  M3_LOG_INFO("node {}: joined the control group of {} nodes (this host's ranks listen on {})", o.node_rank,
              o.nnodes, n.gloo.hostname);
  return n;
}

#if M3SERVE_WITH_NCCL
// A group's NCCL id: made here on one host; across hosts made by node 0 and read from the store
// by the others (its 128 bytes, under nccl/<group>).
NcclUniqueId shared_nccl_id(TcpStore* store, int node_rank, const std::string& group) {
  if (store == nullptr) return make_nccl_unique_id();
  const std::string key = "nccl/" + group;
  NcclUniqueId id;
  if (node_rank == 0) {
    id = make_nccl_unique_id();
    std::vector<char> bytes(NcclUniqueId::kBytes);
    std::memcpy(bytes.data(), id.bytes.data(), bytes.size());
    store->set(key, bytes);
    return id;
  }
  const std::vector<char> bytes = store->get(key);
  M3_CHECK(bytes.size() == NcclUniqueId::kBytes, "rendezvous store at {}: '{}' holds {} bytes, an NCCL id {}",
           store->address(), key, bytes.size(), NcclUniqueId::kBytes);
  std::memcpy(id.bytes.data(), bytes.data(), bytes.size());
  return id;
}
#endif

}  // namespace

LoadedModel load_model(const ModelOptions& o, const EngineOptions& engine, const KvDemand& demand,
                       const BackendWrapper& wrap) {
  ModelPlan plan = plan_model(o);
  const KvLayout& layout = plan.kv_layout;
  const auto blocks_for = [&](int64_t tokens) { return (tokens + layout.block_size - 1) / layout.block_size; };
  const int world = plan.layout.config.world_size();
  const int num_ranks = world / o.nnodes;  // this process's
  const int first_rank = o.node_rank * num_ranks;
  int batched_tokens = local_batched_tokens(engine, plan);
  // Before any weight is read (the engine checks it again against the length it resolves).
  M3_CHECK(engine.enable_chunked_prefill || batched_tokens >= plan.max_model_len,
           "--max-num-batched-tokens {} is smaller than the max model length {} with --no-enable-chunked-prefill: "
           "a prompt is prefilled in one step, so the step must hold the longest one; raise "
           "--max-num-batched-tokens or lower --max-model-len (or leave --max-num-batched-tokens unset)",
           batched_tokens, plan.max_model_len);
  if (plan.device == "cuda") check_weights_fit_gpus(plan, o, engine, batched_tokens);
  // A DSpark drafter keeps its cache in blocks beside the target's (on each copy's rank 0; sized here
  // as if on every rank): the pool's budgets count its share of a block.
  const DrafterBytes drafter =
      dspark_bytes(o, engine, plan.device, layout.block_size, plan.layout.config.tensor_parallel_size > 1);
  const int64_t block_bytes = layout.block_bytes + drafter.per_block;
  if (!o.kv_offloading_size.empty()) {
    M3_CHECK(engine.enable_prefix_caching,
             "--kv-offloading-size is the host tier of the prefix cache, and --no-enable-prefix-caching turns that "
             "off; drop one of them");
    // The size is every rank's together: under -tp each rank holds its share of every slot, under
    // DEP each rank (a lane) holds whole blocks in slots of its own; either way slots x ranks x a
    // rank's block bytes.
    plan.runtime.num_host_kv_blocks = kv_offload_slots(o.kv_offloading_size, block_bytes, world, num_ranks);
  }
  // Several hosts: meet the other nodes first (the control group), so a node that cannot join
  // fails before anyone reads weights.
  NodeRendezvous nodes = o.several_nodes() ? meet_nodes(o) : NodeRendezvous{};
  if (nodes.control) {
    // The engine's host slots index every node's tier (node 0 announces the copies): the nodes
    // must have been given the same tier.
    const int64_t slots = plan.runtime.num_host_kv_blocks;
    const int64_t fewest = nodes.control->min_over_nodes(slots);
    const int64_t most = -nodes.control->min_over_nodes(-slots);
    M3_CHECK(fewest == most,
             "node {}: the nodes' KV host tiers differ ({} to {} slots per rank; this node's --kv-offloading-size "
             "'{}' gives {}): start every node with the same --kv-offloading-size",
             o.node_rank, fewest, most, o.kv_offloading_size, slots);
    // Node 0's engine schedules the steps every node runs: the smallest default keeps them all
    // within the activation reserve each checked above.
    batched_tokens = static_cast<int>(nodes.control->min_over_nodes(batched_tokens));
  }

  const auto t0 = std::chrono::steady_clock::now();
  // Dummy weights over several ranks: each rank builds its own slices on its thread (the same
  // bytes as cutting the whole model), so no host ever holds the whole model.
  const bool dummy_shards = o.load_format == "dummy" && world > 1;
  ModelWeights weights;
  if (dummy_shards) {
    M3_LOG_INFO("building random (dummy) weights: each of ranks {}..{} its own slices", first_rank,
                first_rank + num_ranks - 1);
  } else if (o.load_format == "dummy") {
    M3_LOG_INFO("building random (dummy) weights");
    weights = make_dummy_weights(plan.config, o.seed);
  } else {
    ConsoleProgress progress;
    weights = load_weights(plan.config, o.model_dir, &progress);
  }
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> shard_build_s(num_ranks, 0.0);  // dummy_shards: each rank's build
  const unsigned fill_threads = std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(num_ranks));

  LoadedModel m;
  m.device = plan.device;
  m.max_model_len = plan.max_model_len;
  m.max_num_batched_tokens = batched_tokens;
  m.layout = plan.layout;
  m.first_rank = first_rank;
  m.ranks.resize(num_ranks);
  std::vector<ModelWeights> rank_weights(num_ranks);
  std::vector<int64_t> gpu_budget(num_ranks, 0);
  const double utilization = o.gpu_memory_utilization.value_or(kDefaultGpuMemoryUtilization);
  const int64_t reserve = plan.device == "cuda"
                              ? gpu_activation_reserve_bytes(plan.config, plan.layout, batched_tokens,
                                                             engine.max_num_seqs)
                              : 0;
  const bool gpu_budget_sizes_pool = plan.device == "cuda" && o.num_kv_blocks == 0 && o.kv_cache_memory.empty();

  // Each rank: its backend, its group, its slice of the weights on its device, and its KV budget.
  // Ranks run on their own threads (a GPU each) when there are several.
  const auto t1 = std::chrono::steady_clock::now();
  GlooRendezvous gloo = nodes.store ? GlooRendezvous::tcp(nodes.store) : GlooRendezvous::in_process();
  const bool dep = plan.layout.attention_data_parallel();
  const int tp = plan.layout.config.tensor_parallel_size, dp = plan.layout.config.data_parallel_size;
#if M3SERVE_WITH_NCCL
  const bool nccl = plan.device == "cuda" && world > 1;
  const NcclUniqueId nccl_id = nccl && !dep ? shared_nccl_id(nodes.store.get(), o.node_rank, "tp") : NcclUniqueId{};
  // DEP: an id per copy's tp group and one per tp rank's expert group (node 0's, over hosts).
  std::vector<NcclUniqueId> copy_ids, expert_ids;
  if (nccl && dep) {
    for (int d = 0; d < dp && tp > 1; ++d)
      copy_ids.push_back(shared_nccl_id(nodes.store.get(), o.node_rank, fmt::format("tp.{}", d)));
    for (int j = 0; j < tp; ++j)
      expert_ids.push_back(shared_nccl_id(nodes.store.get(), o.node_rank, fmt::format("ep.{}", j)));
  }
#endif
  const auto set_up_rank = [&](int r) {
    const int g = first_rank + r;  // the global rank
    RankModel& rank = m.ranks[r];
    rank.backend = make_device_backend(plan.device, o);
    if (dep) {
      // The copy's -tp group (tp.<copy>, on this host: hosts hold whole copies), and the experts'
      // exchange over the ranks with this tp rank in every copy (ep.<tp rank>, by copy, over
      // every host) on the device's engine, its per-step token count over host memory
      // (ep-host.<tp rank>). Every rank joins them in this order and the groups of each kind are
      // disjoint, so no group waits for a rank still joining another.
      const RankShard& shard = plan.layout.ranks[g];
      const std::string copy = fmt::format("tp.{}", shard.dp_rank), experts = fmt::format("ep.{}", shard.tp_rank);
      rank.ep_host = connect_gloo(gloo, shard.dp_rank, dp, fmt::format("ep-host.{}", shard.tp_rank), nodes.gloo);
      if (plan.device == "cpu") {
        if (tp > 1) rank.tp = connect_gloo(gloo, shard.tp_rank, tp, copy, nodes.gloo);
        rank.ep = connect_gloo(gloo, shard.dp_rank, dp, experts, nodes.gloo);
      } else {
#if M3SERVE_WITH_NCCL
        void* stream = cuda_backend_stream(*rank.backend);
        if (tp > 1) rank.tp = connect_nccl(copy_ids[shard.dp_rank], shard.tp_rank, tp, r, stream, copy);
        rank.ep = connect_nccl(expert_ids[shard.tp_rank], shard.dp_rank, dp, r, stream, experts);
#else
        fail("--data-parallel-size {} on the GPU needs NCCL, and this build has none", dp);
#endif
      }
    } else if (world > 1) {
      if (plan.device == "cpu") {
        rank.tp = connect_gloo(gloo, g, world, "tp", nodes.gloo);
      } else {
#if M3SERVE_WITH_NCCL
        rank.tp = connect_nccl(nccl_id, g, world, r, cuda_backend_stream(*rank.backend), "tp");
#else
        fail("-tp {} on the GPU needs NCCL, and this build has none", world);
#endif
      }
    }
    ModelWeights mine;
    if (world == 1) {
      mine = std::move(weights);
    } else if (dummy_shards) {
      const auto start = std::chrono::steady_clock::now();
      mine = make_dummy_shard(plan.config, o.seed, plan.layout.ranks[g], fill_threads);
      shard_build_s[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } else {
      mine = shard_weights(weights, plan.config, plan.layout.ranks[g]);
    }
    rank_weights[r] = place_weights(std::move(mine), *rank.backend);  // cuda: the weights move to the GPU
    if (world > 1)
      M3_LOG_INFO("rank {}: weights {} and placed on {} in {:.2f} s", g, dummy_shards ? "built" : "sliced", plan.device,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    if (gpu_budget_sizes_pool)
      gpu_budget[r] = gpu_kv_budget_blocks(utilization, block_bytes, reserve + drafter.weights);
  };
  // Threads for `count` local ranks from `first`: each bound to its rank's GPU, or on the CPU given
  // its share of the cores (the CPU backend's loops share them between ranks).
  const int threads_per_rank = std::max(1, omp_get_max_threads() / num_ranks);
  const bool gpu = plan.device == "cuda";
  const auto rank_threads = [gpu, threads_per_rank](int count, int first) {
    return std::make_unique<RankWorkers>(count, [gpu, threads_per_rank, first](int i) {
      if (gpu) use_device(first + i);
      else omp_set_num_threads(threads_per_rank);
    });
  };
  if (world == 1) {
    set_up_rank(0);
  } else {
    m.workers = rank_threads(num_ranks, 0);
    m.workers->run(set_up_rank);
    weights = ModelWeights{};  // the ranks hold their slices (views into it stay alive through keep_alive)
    if (dummy_shards) load_s += *std::max_element(shard_build_s.begin(), shard_build_s.end());
  }
  if (plan.device != "cpu") {
    M3_LOG_INFO("weights placed on {} rank{} in {:.2f} s", num_ranks, num_ranks == 1 ? "" : "s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
  }

  // The KV pool: as given, else the demand within the device's budget (the smallest rank's: the
  // engine's block ids index every rank's pool).
  int64_t& pool = plan.runtime.num_kv_blocks;
  const int64_t per_sequence = blocks_for(demand.tokens_per_sequence > 0 ? demand.tokens_per_sequence : plan.max_model_len);
  const int64_t wanted = std::max<int64_t>(1, demand.sequences) * per_sequence;
  if (o.num_kv_blocks > 0) {
    pool = o.num_kv_blocks;
  } else if (!o.kv_cache_memory.empty()) {
    pool = parse_memory_size(o.kv_cache_memory, "--kv-cache-memory") / block_bytes;
    M3_CHECK(pool > 0, "--kv-cache-memory {} holds no KV block ({} bytes each)", o.kv_cache_memory, block_bytes);
  } else if (plan.device == "cuda") {
    const int64_t budget = *std::min_element(gpu_budget.begin(), gpu_budget.end());
    pool = demand.whole_gpu_budget ? budget : std::min(budget, wanted);
    M3_LOG_INFO("--gpu-memory-utilization {}: {} KV blocks of {} bytes per rank (budget {} blocks)", utilization, pool,
                block_bytes, budget);
  } else {
    pool = std::max(per_sequence, std::min(kCpuKvBudgetBytes / block_bytes, wanted));
  }
  // Across hosts too the engine's block ids index every rank's pool.
  if (nodes.control) pool = nodes.control->min_over_nodes(pool);

  log_plan(plan, pool, engine, batched_tokens);

  const auto build_rank = [&](int r) {
    RankModel& rank = m.ranks[r];
    Backend* runs_on = rank.backend.get();
    if (wrap) {
      rank.wrapper = wrap(*rank.backend, first_rank + r);
      runs_on = rank.wrapper.get();
    }
    ModelPartition partition{plan.layout.ranks[first_rank + r], plan.layout.padded_vocab_size, rank.tp.get(),
                             plan.attention.indexer_decode_cp, rank.ep.get(), rank.ep_host.get()};
    rank.model = std::make_unique<MiniMaxM3>(plan.config, std::move(rank_weights[r]), *runs_on, plan.runtime,
                                             std::move(partition));
  };
  if (world == 1) build_rank(0);
  else m.workers->run(build_rank);
  if (dep && tp > 1) {
    // Each local copy's lane drives its ranks on threads of its own, bound as the loading threads
    // were.
    for (int c = 0; c < num_ranks / tp; ++c) m.copy_workers.push_back(rank_threads(tp, c * tp));
  }
  if (nodes.control && dep) {
    // DEP over hosts: node 0 drives each copy another node holds over a channel of its own (the
    // two nodes, copy.<d>), made in copy order on every node.
    const int copies_per_node = dp / o.nnodes;
    m.copy_channels.resize(dp);
    for (int d = copies_per_node; d < dp; ++d) {
      const int holder = d / copies_per_node;
      if (o.node_rank != 0 && o.node_rank != holder) continue;
      m.copy_channels[d] = std::make_unique<ControlGroup>(
          connect_gloo(gloo, o.node_rank == 0 ? 0 : 1, 2, fmt::format("copy.{}", d), nodes.gloo), nodes.gloo.timeout);
    }
  }
  if (nodes.control) {
    // Every node has loaded and left the store: from here node 0 only sends steps (and heartbeats
    // while idle), and the followers only wait for them; under DEP over the copies' channels.
    nodes.control->barrier();
    if (nodes.control->leader()) {
      if (dep) {
        for (const auto& channel : m.copy_channels)
          if (channel) channel->start_heartbeat();
      } else {
        nodes.control->start_heartbeat();
      }
    }
    M3_LOG_INFO("node {} of {}: ranks {}..{} of {} loaded{}", o.node_rank, o.nnodes, first_rank,
                first_rank + num_ranks - 1, world, o.node_rank == 0 ? "" : "; following node 0's steps");
    m.control = std::move(nodes.control);
  }

  const MiniMaxM3& model = m.model();
  M3_LOG_INFO("model {}: {} layers ({} sparse), hidden {}, vocab {}; weights {} in {:.2f} s", o.model_dir,
              model.config().num_layers, model.config().num_sparse_layers(), model.config().hidden_size,
              model.config().vocab_size, o.load_format == "dummy" ? "dummy" : "loaded", load_s);
  M3_LOG_INFO("backend {}: activations {}, KV {} (index {}); pool {} blocks x {} tokens = {} tokens, {} B/token, "
              "{:.1f} MiB{}; max model len {}",
              m.ranks.front().backend->name(), dtype_name(plan.runtime.activation_dtype),
              kv_dtype_name(plan.runtime.kv_dtype), kv_dtype_name(plan.runtime.index_dtype), model.num_kv_blocks(),
              model.block_size(), model.num_kv_blocks() * model.block_size(), model.kv_bytes_per_token(),
              model.kv_pool_bytes() / (1024.0 * 1024.0), num_ranks == 1 ? "" : " per rank", m.max_model_len);
  if (model.num_host_kv_blocks() > 0)
    M3_LOG_INFO("KV host tier (--kv-offloading-size {} GiB): {} blocks{} = {:.1f} MiB{}", o.kv_offloading_size,
                model.num_host_kv_blocks(), plan.layout.attention_data_parallel() ? " per lane" : "",
                model.num_host_kv_blocks() * layout.block_bytes / (1024.0 * 1024.0), num_ranks == 1 ? "" : " per rank");
  return m;
}

std::unique_ptr<ModelRunner> LoadedModel::make_runner() const {
  M3_CHECK(!layout.attention_data_parallel(),
           "--data-parallel-size {}: data-parallel copies run through the engine, one lane each (serve, generate, "
           "score, bench throughput / serve); this command drives one model directly",
           layout.config.data_parallel_size);
  if (!workers) return std::make_unique<MiniMaxM3Runner>(*ranks.front().model);
  std::vector<MiniMaxM3*> models;
  for (const RankModel& r : ranks) models.push_back(r.model.get());
  // Node 0 announces each step to the followers; a follower's runner just runs its ranks.
  return std::make_unique<MiniMaxM3Runner>(std::move(models), *workers, follower() ? nullptr : control.get());
}

std::optional<std::string> LoadedModel::lost_node() const {
  if (!control || !control->leader()) return std::nullopt;
  if (auto why = control->lost()) return fmt::format("the control group of {} nodes: {}", control->num_nodes(), *why);
  for (size_t d = 0; d < copy_channels.size(); ++d) {
    if (!copy_channels[d]) continue;
    if (auto why = copy_channels[d]->lost()) return fmt::format("the channel to copy {}: {}", d, *why);
  }
  return std::nullopt;
}

std::vector<std::unique_ptr<ModelRunner>> LoadedModel::make_copy_runners() const {
  M3_CHECK(layout.attention_data_parallel(), "make_copy_runners: the layout has no data-parallel copies");
  const int tp = layout.config.tensor_parallel_size;
  std::vector<std::unique_ptr<ModelRunner>> copies;
  if (tp == 1) {
    for (const RankModel& r : ranks) copies.push_back(std::make_unique<MiniMaxM3Runner>(*r.model));
    return copies;
  }
  M3_CHECK(copy_workers.size() * tp == ranks.size(),
           "{} copies of -tp {} for {} ranks: the loader made no threads for the copies' ranks", copy_workers.size(),
           tp, ranks.size());
  for (size_t c = 0; c < copy_workers.size(); ++c) {
    std::vector<MiniMaxM3*> copy;
    for (int j = 0; j < tp; ++j) copy.push_back(ranks[c * tp + j].model.get());
    copies.push_back(std::make_unique<MiniMaxM3Runner>(std::move(copy), *copy_workers[c]));
  }
  return copies;
}

void attach_dspark(const std::vector<MiniMaxM3Runner*>& runners, const LoadedModel& loaded, const ModelOptions& options,
                   const SpeculativeConfig& spec) {
  M3_CHECK(options.load_format != "dummy",
           "--speculative-config: method dspark needs the drafter's weights; --load-format dummy has none");
  const MiniMaxM3& model = loaded.model();
  const ModelConfig& config = model.config();
  const std::filesystem::path dir = dspark_dir(spec, options);
  M3_CHECK(std::filesystem::is_regular_file(dir / "config.json"),
           "--speculative-config: method dspark: no drafter at {} (no config.json there); the drafter ships in "
           "dspark/ beside the model, or name its directory with \"model\"",
           dir.string());
  const KvDType cache = dspark_cache_dtype(spec, loaded.device);
  std::optional<ModelWeights> host;  // the checkpoint's embedding and lm_head, for vocab-parallel ranks
  // Data-parallel copies of one rank each have no rank threads: lane i's GPU is made current here
  // (as the lane's own thread does) while its drafter is built, then GPU 0 again.
  const bool lane_devices = loaded.device == "cuda" && loaded.layout.attention_data_parallel() &&
                            loaded.layout.config.tensor_parallel_size == 1;
  for (size_t lane = 0; lane < runners.size(); ++lane) {
    MiniMaxM3Runner* runner = runners[lane];
    if (lane_devices) use_device(static_cast<int>(lane));
    MiniMaxM3& rank0 = runner->rank_zero();
    const ModelWeights& w = rank0.weights();
    const bool whole = w.embed.dim(0) == config.vocab_size && w.lm_head.out_features == config.vocab_size;
    if (!whole && !host) host = load_weights(config, options.model_dir);
    std::unique_ptr<DSparkDrafter> drafter;
    runner->on_rank_zero([&] {
      Backend& backend = rank0.backend();
      Tensor embed = whole ? w.embed : backend.to_device(host->embed, "the DSpark drafter's embedding");
      LinearWeight head = whole ? w.lm_head : host->lm_head;
      if (!whole) {
        head.weight = backend.to_device(head.weight, "the DSpark drafter's lm_head");
        head.scale = backend.to_device(head.scale, "the DSpark drafter's lm_head scales");
      }
      drafter = load_dspark_drafter(dir, config, backend, std::move(embed), std::move(head), rank0.num_kv_blocks(),
                                    rank0.block_size(), cache, rank0.num_host_kv_blocks());
    });
    M3_CHECK(spec.num_speculative_tokens <= drafter->config().block_size,
             "--speculative-config: num_speculative_tokens {} is more than the drafter's block of {} "
             "(dspark_block_size in {})",
             spec.num_speculative_tokens, drafter->config().block_size, (dir / "config.json").string());
    if (runner == runners.front())
      M3_LOG_INFO("DSpark drafter {}: {} layers, block of {}, taps after layers {}, Markov rank {}, {} drafts; on the "
                  "{} backend of rank 0, {} cache ({} bytes per block){}; {} of them (one per engine lane)",
                  dir.string(), drafter->config().num_layers, drafter->config().block_size,
                  fmt::join(drafter->config().target_layer_ids, ","), drafter->config().markov_rank,
                  spec.probabilistic_drafts ? "probabilistic" : "greedy", rank0.backend().name(), kv_dtype_name(cache),
                  drafter->kv_block_bytes(), whole ? "" : ", its own copy of the embedding and lm_head",
                  runners.size());
    runner->attach_dspark(std::move(drafter), spec.probabilistic_drafts);
  }
  if (lane_devices) use_device(0);
}

std::unique_ptr<EngineCore> make_engine(LoadedModel& loaded, const ModelOptions& options, const EngineOptions& engine) {
  check_engine_options(engine);
  M3_CHECK(!loaded.follower(), "node {}: a follower node runs node 0's steps (follow_node_zero), not an engine",
           loaded.control ? loaded.control->node_rank() : 0);
  const MiniMaxM3& model = loaded.model();
  EngineConfig config;
  config.max_num_seqs = engine.max_num_seqs;
  config.max_num_batched_tokens = loaded.max_num_batched_tokens;
  config.enable_prefix_caching = engine.enable_prefix_caching;
  config.enable_chunked_prefill = engine.enable_chunked_prefill;
  config.seed = options.seed;
  config.speculative = speculative_config(engine);
  if (config.speculative) M3_LOG_INFO("speculative decoding: {}", config.speculative->summary());
  const int64_t capacity = model.num_kv_blocks() * model.block_size();
  config.max_model_len =
      static_cast<int>(options.max_model_len > 0 ? loaded.max_model_len : std::min(loaded.max_model_len, capacity));
  std::unique_ptr<EngineCore> core;
  if (loaded.layout.attention_data_parallel()) {
    // One engine lane per data-parallel copy: those of this host run here (with -tp 1 the lane's
    // thread is the rank's; with -tp > 1 the lane's runner drives the copy's ranks on their
    // threads, copy_workers, as a tensor-parallel runner does), those of other hosts there.
    const int tp = loaded.layout.config.tensor_parallel_size;
    std::vector<std::unique_ptr<ModelRunner>> lanes = loaded.make_copy_runners();
    const int local = static_cast<int>(lanes.size());
    const bool dspark = config.speculative && config.speculative->method == "dspark";
    int dspark_block_size = 0;
    if (dspark) {
      // A drafter per copy: each lane has its own KV pool, so its own drafter cache. Copies on other
      // hosts have theirs there (app/node_follower); their lanes send them the blocks to draft.
      std::vector<MiniMaxM3Runner*> runners;
      for (auto& lane : lanes) runners.push_back(static_cast<MiniMaxM3Runner*>(lane.get()));
      attach_dspark(runners, loaded, options, *config.speculative);
      dspark_block_size = load_dspark_config(dspark_dir(*config.speculative, options)).block_size;
    }
    for (int d = local; d < loaded.layout.config.data_parallel_size; ++d) {
      M3_CHECK(d < static_cast<int>(loaded.copy_channels.size()) && loaded.copy_channels[d],
               "copy {}: held by another node, and node 0 has no channel to it", d);
      RemoteCopyGeometry g;
      g.block_size = model.block_size();
      g.num_kv_blocks = model.num_kv_blocks();
      g.vocab_size = model.config().vocab_size;
      g.max_position_embeddings = model.config().max_position_embeddings;
      g.num_host_kv_blocks = model.num_host_kv_blocks();
      g.kv_block_bytes = lanes.front()->kv_block_bytes();  // every copy's ranks hold the same shares
      g.copy = d;
      g.node = d / local;
      auto remote = std::make_unique<RemoteCopyRunner>(*loaded.copy_channels[d], g);
      if (dspark) remote->attach_dspark(dspark_block_size, config.speculative->probabilistic_drafts);
      lanes.push_back(std::move(remote));
    }
    const int threads_per_lane = std::max(1, omp_get_max_threads() / local);
    const bool gpu = loaded.device == "cuda";
    core = std::make_unique<EngineCore>(std::move(lanes), config, [threads_per_lane, gpu, tp, local](int lane) {
      if (lane >= local) return;  // a remote copy's lane only waits for its node's replies
      if (gpu) use_device(lane * tp);  // a lane's thread drives its rank's GPU (with -tp > 1: its first rank's)
      else omp_set_num_threads(threads_per_lane);
    });
  } else {
    std::unique_ptr<ModelRunner> runner = loaded.make_runner();
    if (config.speculative && config.speculative->method == "dspark")
      attach_dspark({static_cast<MiniMaxM3Runner*>(runner.get())}, loaded, options, *config.speculative);
    core = std::make_unique<EngineCore>(std::move(runner), config);
  }
  M3_LOG_INFO("KV cache: {} tokens ({} blocks of {}); max model len {}, so up to {:.2f} full-length requests at once",
              core->kv_capacity_tokens(), model.num_kv_blocks(), model.block_size(), core->max_model_len(),
              static_cast<double>(core->kv_capacity_tokens()) / core->max_model_len());
  return core;
}

}  // namespace m3::app
