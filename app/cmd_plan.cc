// m3serve plan MODEL_DIR --num-gpus N --gpu-memory-gb G [serving options]: how a deployment
// splits the model (parallel/layout.h) and how many sequences of --max-model-len tokens its KV
// pools hold, from config.json alone (no weight is read): the weights per rank, K+V and index-K
// bytes per token per rank, the activation reserve and the concurrent sequences over all
// data-parallel copies (app/capacity_plan.h states the assumptions). Layouts that do not fit the
// model fail naming the option and the dimension, as serve does.
//
// The seed's capacity figure (docs/architecture.md "Capacity plan"), on 4 x B300 (288 GB) in DEP4
// at 256K tokens, --gpu-memory-utilization 0.95:
//   plan bench/configs/minimax-m3.1 --num-gpus 4 --gpu-memory-gb 288 --data-parallel-size 4
//     --enable-expert-parallel --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype":"nvfp4"}'
//     --max-model-len 262144 --gpu-memory-utilization 0.95                              -> 76
//   plan bench/configs/minimax-m3 ... --kv-cache-dtype fp8
//     --attention-config '{"indexer_kv_dtype":"bfloat16"}' (the same otherwise)          -> 28
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "app/capacity_plan.h"
#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "core/error.h"

namespace m3::app {
namespace {

struct PlanArgs {
  std::string model_dir;
  HubOptions hub;  // when model_dir is a Hugging Face repo id
  int num_gpus = 0;
  double gpu_memory_gb = 0;
  ParallelConfig parallel;
  std::string kv_cache_dtype = "auto";
  std::string attention_config;
  int64_t max_model_len = 0;
  double gpu_memory_utilization = 0.9;  // vLLM's default, as serve
  EngineOptions engine;                 // the step the activation reserve is sized for
  bool json = false;
};

std::string slice_text(const Slice& s) { return fmt::format("[{}, {})", s.begin, s.end()); }

// serve's step budget on GPUs of --gpu-memory-gb. The plan knows no GPU's name, so an 80 GB A100
// counts as large here, where serve on one keeps 2048 tokens (default_batched_tokens).
int batched_tokens(const PlanArgs& a, int64_t max_model_len) {
  return a.engine.batched_tokens(max_model_len, static_cast<int64_t>(a.gpu_memory_gb * 1e9), "");
}

nlohmann::json plan_json(const PlanArgs& a, const CapacityPlan& p, int64_t max_model_len) {
  const RankShard& r0 = p.layout.ranks.front();
  return {
      {"model", a.model_dir},
      {"num_gpus", a.num_gpus},
      {"gpu_memory_bytes", static_cast<int64_t>(a.gpu_memory_gb * 1e9)},
      {"gpu_memory_utilization", a.gpu_memory_utilization},
      {"tensor_parallel_size", a.parallel.tensor_parallel_size},
      {"data_parallel_size", a.parallel.data_parallel_size},
      {"expert_parallel_size", p.layout.expert_parallel_size},
      {"attention_data_parallel", p.layout.attention_data_parallel()},
      {"kv_cache_dtype", kv_dtype_name(p.kv_layout.kv_dtype)},
      {"index_k_dtype", kv_dtype_name(p.kv_layout.index_dtype)},
      {"max_model_len", max_model_len},
      {"max_num_batched_tokens", batched_tokens(a, max_model_len)},
      {"rank0",
       {{"q_heads", r0.q_heads.size},
        {"kv_heads", r0.kv_heads.size},
        {"index_heads", r0.index_heads.size},
        {"experts", r0.experts.size},
        {"expert_intermediate", r0.expert_intermediate.size},
        {"vocab_rows", r0.vocab.size}}},
      {"padded_vocab_size", p.layout.padded_vocab_size},
      {"kv_head_replicas", p.layout.kv_head_replicas},
      {"weights_per_rank_bytes", p.weights.total()},
      {"weights_per_rank",
       {{"embedding", p.weights.embedding},
        {"attention", p.weights.attention},
        {"dense_mlp", p.weights.dense_mlp},
        {"shared_expert_and_router", p.weights.shared_expert},
        {"routed_experts", p.weights.routed_experts}}},
      {"kv_bytes_per_token", p.token_bytes.kv},
      {"index_k_bytes_per_token", p.token_bytes.index_k},
      {"kv_total_bytes_per_token", p.token_bytes.total},
      {"block_size", p.kv_layout.block_size},
      {"block_bytes", p.kv_layout.block_bytes},
      {"activation_reserve_bytes", p.activation_reserve_bytes},
      {"budget_bytes", p.budget_bytes},
      {"kv_pool_bytes_per_rank", p.kv_pool_bytes},
      {"kv_blocks_per_rank", p.kv_blocks},
      {"blocks_per_sequence", p.blocks_per_sequence},
      {"sequences_per_data_parallel_rank", p.sequences_per_copy},
      {"max_concurrent_sequences", p.max_concurrent_sequences},
  };
}

void print_plan(const PlanArgs& a, const ModelConfig& c, const CapacityPlan& p, int64_t max_model_len) {
  const ParallelLayout& l = p.layout;
  const RankShard& r0 = l.ranks.front();
  const auto gb = [](int64_t bytes) { return bytes / 1e9; };
  std::printf("%s: %d layers (%d sparse, %d MoE), %d/%d heads, %d experts, vocab %d\n", a.model_dir.c_str(),
              c.num_layers, c.num_sparse_layers(), c.num_moe_layers(), c.num_heads, c.num_kv_heads, c.num_experts,
              c.vocab_size);
  std::printf("layout: %d GPUs of %.1f GB = -tp %d x --data-parallel-size %d%s%s\n", a.num_gpus, a.gpu_memory_gb,
              a.parallel.tensor_parallel_size, a.parallel.data_parallel_size,
              a.parallel.enable_expert_parallel ? fmt::format(", expert parallel (EP {})", l.expert_parallel_size).c_str()
                                                : "",
              l.attention_data_parallel() ? ", data-parallel attention" : "");
  std::printf("rank 0 holds: query heads %s, KV heads %s%s, index heads %s, experts %s (intermediate %s), vocab rows "
              "%s of %lld (padded from %d)\n",
              slice_text(r0.q_heads).c_str(), slice_text(r0.kv_heads).c_str(),
              l.kv_head_replicas > 1 ? fmt::format(" (each on {} ranks)", l.kv_head_replicas).c_str() : "",
              slice_text(r0.index_heads).c_str(), slice_text(r0.experts).c_str(),
              slice_text(r0.expert_intermediate).c_str(), slice_text(r0.vocab).c_str(),
              static_cast<long long>(l.padded_vocab_size), c.vocab_size);
  std::printf("weights per rank: %.2f GB (embedding + lm_head %.2f, attention %.2f, dense MLP %.2f, shared expert + "
              "router %.2f, routed experts %.2f)\n",
              gb(p.weights.total()), gb(p.weights.embedding), gb(p.weights.attention), gb(p.weights.dense_mlp),
              gb(p.weights.shared_expert), gb(p.weights.routed_experts));
  std::printf("KV per token per rank: K+V %lld B (%s) + index-K %lld B (%s) = %lld B\n",
              static_cast<long long>(p.token_bytes.kv), std::string(kv_dtype_name(p.kv_layout.kv_dtype)).c_str(),
              static_cast<long long>(p.token_bytes.index_k), std::string(kv_dtype_name(p.kv_layout.index_dtype)).c_str(),
              static_cast<long long>(p.token_bytes.total));
  std::printf("activation reserve per rank: %.2f GB (1 GiB context/workspaces + %d batched tokens + %d logits rows)\n",
              gb(p.activation_reserve_bytes), batched_tokens(a, max_model_len), a.engine.max_num_seqs);
  std::printf("KV pool per rank: %.2f x %.1f GB - weights - reserve = %.2f GB = %lld blocks of %d tokens\n",
              a.gpu_memory_utilization, a.gpu_memory_gb, gb(p.kv_pool_bytes), static_cast<long long>(p.kv_blocks),
              p.kv_layout.block_size);
  std::printf("%lld tokens = %lld blocks per sequence: %lld sequences per data-parallel rank x %d = %lld concurrent "
              "sequences\n",
              static_cast<long long>(max_model_len), static_cast<long long>(p.blocks_per_sequence),
              static_cast<long long>(p.sequences_per_copy), a.parallel.data_parallel_size,
              static_cast<long long>(p.max_concurrent_sequences));
}

void run_plan(const PlanArgs& a) {
  check_parallel_config(a.parallel);
  M3_CHECK(a.num_gpus >= 1, "--num-gpus must be >= 1, got {}", a.num_gpus);
  M3_CHECK(a.num_gpus == a.parallel.world_size(),
           "--num-gpus {}: the layout -tp {} x --data-parallel-size {} uses {} GPUs (one rank per GPU)", a.num_gpus,
           a.parallel.tensor_parallel_size, a.parallel.data_parallel_size, a.parallel.world_size());
  M3_CHECK(a.gpu_memory_gb > 0, "--gpu-memory-gb must be positive, got {}", a.gpu_memory_gb);
  check_engine_options(a.engine);
  // The loader's own reading of the model and the KV options (dtypes, --attention-config,
  // --max-model-len default), without a device: the plan is for GPUs this machine need not have.
  ModelOptions model;
  model.model_dir = locate_model_dir(a.model_dir, a.hub, hub::FileSet::kConfig, "MODEL");
  model.kv_cache_dtype = a.kv_cache_dtype;
  model.attention_config = a.attention_config;
  model.max_model_len = a.max_model_len;
  model.device = "cpu";
  model.dtype = "bfloat16";  // the GPU's activations: "auto" KV means bf16
  const ModelPlan mp = plan_model(model);
  CapacityRequest r;
  r.parallel = a.parallel;
  r.kv_dtype = mp.runtime.kv_dtype;
  r.index_dtype = mp.runtime.index_dtype;
  r.max_model_len = mp.max_model_len;
  r.gpu_memory_bytes = static_cast<int64_t>(a.gpu_memory_gb * 1e9);
  r.gpu_memory_utilization = a.gpu_memory_utilization;
  r.max_num_seqs = a.engine.max_num_seqs;
  r.max_num_batched_tokens = batched_tokens(a, mp.max_model_len);
  const CapacityPlan p = plan_capacity(mp.config, r);
  if (a.json) {
    std::printf("%s\n", plan_json(a, p, mp.max_model_len).dump(2).c_str());
  } else {
    print_plan(a, mp.config, p, mp.max_model_len);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  PlanArgs& a = *args;
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "how a deployment splits the model and how many sequences of --max-model-len tokens fit: weights, KV and "
      "index-K bytes per rank, from config.json alone. Usable memory per GPU is --gpu-memory-utilization x "
      "--gpu-memory-gb (GB = 1e9 bytes), less the rank's weights and the activation reserve (1 GiB + the step's "
      "activations at --max-num-batched-tokens and logits at --max-num-seqs, as serve keeps; unset, the step "
      "budget is serve's default for that memory: 8192 tokens from 70 GiB, else 2048)");
  cmd->add_option("model", a.model_dir, "model directory (config.json), or a Hugging Face repo id (org/name)")
      ->required();
  add_hub_options(*cmd, a.hub);
  cmd->add_option("--num-gpus", a.num_gpus, "GPUs of the deployment: -tp x --data-parallel-size")->required();
  cmd->add_option("--gpu-memory-gb", a.gpu_memory_gb, "memory of each GPU in GB (1e9 bytes), e.g. 141 (H200), 288 (B300)")
      ->required();
  cmd->add_option("-t,--tensor-parallel-size", a.parallel.tensor_parallel_size, "ranks per model copy (-tp N too)")
      ->capture_default_str();
  cmd->add_option("--data-parallel-size", a.parallel.data_parallel_size,
                  "model copies, each scheduling its own requests (data-parallel attention)")
      ->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", a.parallel.enable_expert_parallel,
                "spread the routed experts whole over all -tp x --data-parallel-size ranks");
  cmd->add_option("--kv-cache-dtype", a.kv_cache_dtype, "auto (bfloat16), bfloat16, fp8, nvfp4")->capture_default_str();
  cmd->add_option("--attention-config", a.attention_config,
                  "JSON, e.g. '{\"indexer_kv_dtype\": \"nvfp4\"}' (index-K dtype; default: the KV dtype)");
  cmd->add_option("--max-model-len", a.max_model_len, "tokens per sequence (default min(config, 8192), as serve)");
  cmd->add_option("--gpu-memory-utilization", a.gpu_memory_utilization, "fraction of each GPU's memory to use")
      ->capture_default_str();
  add_engine_options(*cmd, a.engine);
  cmd->add_flag("--json", a.json, "print the plan as JSON (the count as max_concurrent_sequences)");
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace m3::app
