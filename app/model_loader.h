// The one model loader: a model directory and the options every model-running command takes
// (serve, generate, score, bench latency | throughput | serve) -> the model on its backend with
// its KV pool sized, and the engine over it. A flag means the same in every command because
// every command comes through here:
//   --model (a directory or a Hugging Face repo id: --revision, --download-dir; app/model_source.h),
//   --dtype, --kv-cache-dtype, --attention-config, --load-format, --num-layers,
//   --max-model-len, --num-kv-blocks / --kv-cache-memory / --gpu-memory-utilization, --block-size,
//   --quantization, --quantization-config.moe, --seed, --device, --enforce-eager, --batch-invariant,
//   -tp/--tensor-parallel-size, --data-parallel-size, --enable-expert-parallel,
//   --nnodes, --node-rank, --master-addr, --master-port (the parallel layout)
//   --kv-offloading-size, --kv-offloading-backend (the host tier of the prefix cache),
//   --max-num-seqs, --max-num-batched-tokens, --[no-]enable-prefix-caching,
//   --[no-]enable-chunked-prefill (engine options)
// Options that cannot be honoured fail before any weight is read, naming the option.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "app/model_source.h"
#include "engine/engine_core.h"
#include "engine/minimax_m3_runner.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/minimax_m3.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"
#include "parallel/communicator.h"
#include "parallel/control_group.h"
#include "parallel/layout.h"
#include "parallel/parallel_config.h"
#include "parallel/rank_workers.h"

namespace CLI {
class App;
}

namespace m3::app {

struct ModelOptions {
  // A directory, or a Hugging Face repo id until locate_model (app/model_source.h) resolves it.
  std::string model_dir;
  HubOptions hub;  // --revision, --download-dir
  std::string dtype = "auto";           // activations: auto (= bfloat16), bfloat16, float32
  std::string kv_cache_dtype = "auto";  // auto (= activation dtype), float32, bfloat16, fp8, nvfp4
  std::string attention_config;         // JSON: {"indexer_kv_dtype": ..., "indexer_decode_cp": ...}
  std::string load_format = "auto";     // auto | safetensors | dummy
  int num_layers = 0;                   // > 0: keep only the first layers
  int64_t max_model_len = 0;            // 0: min(max_position_embeddings, 8192)
  int64_t num_kv_blocks = 0;            // KV pool size; 0: --kv-cache-memory or the default budget
  std::string kv_cache_memory;          // e.g. 512MiB, 2GiB, or bytes
  std::optional<double> gpu_memory_utilization;  // cuda only; default 0.9 (vLLM's)
  std::optional<int> block_size;        // must equal the model's index_block_size
  // --kv-offloading-size GiB (vLLM's): the host tier of the prefix cache, every rank's share
  // together (app/kv_offloading.h); empty: none. --kv-offloading-backend: only "native".
  std::string kv_offloading_size;
  std::string kv_offloading_backend = "native";
  std::string quantization_moe;         // --quantization-config.moe: must match the checkpoint
  // --quantization (vLLM's method names): must name the checkpoint's quantization_config
  // quant_method (or, for ModelOpt NVFP4, vLLM's "modelopt_fp4"); no quantization at load.
  std::string quantization;
  // --seed (vLLM's, default 0 as vLLM V1): dummy weights, and the engine's draws of the sampling
  // seeds of requests that give none (engine/engine_core.h).
  uint64_t seed = 0;
  std::string device = "auto";          // auto (cuda when a usable GPU is present), cpu, cuda
  bool enforce_eager = false;           // cuda: no CUDA graphs for decode steps
  // --batch-invariant (vLLM's name): a request's outputs bitwise independent of the batch it runs
  // in and of chunked prefill (CudaBackendOptions::batch_invariant). One rank only; the CPU
  // backend always is, so there it changes nothing.
  bool batch_invariant = false;
  ParallelConfig parallel;              // -tp, --data-parallel-size, --enable-expert-parallel
  // --data-parallel-size N (with --enable-expert-parallel, one host): DEP, N engine lanes, each a
  // copy of -tp ranks.
  // Several hosts (--nnodes N --node-rank R --master-addr A --master-port P): the -tp ranks are
  // shared out, tp / N consecutive ranks per host (global rank = R * tp / N + local index); node 0
  // runs the command, the other nodes follow its steps (app/node_follower.h).
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 29500;
  // --node-timeout: seconds a process waits for the other nodes: at start (the rendezvous), in a
  // collective, and a follower for node 0's next message (node 0 sends heartbeats while idle).
  double node_timeout_s = 120;

  bool several_nodes() const { return nnodes > 1; }
};

struct EngineOptions {
  int max_num_seqs = 64;
  std::optional<int> max_num_batched_tokens;  // --max-num-batched-tokens; unset: batched_tokens()
  bool enable_prefix_caching = true;
  // Off (--no-enable-chunked-prefill): a prompt is prefilled in one step, so the step's token
  // budget must cover max-model-len (an error naming both otherwise, as vLLM).
  bool enable_chunked_prefill = true;
  // --speculative-config: vLLM's JSON (engine/speculative_config.h); empty: no speculation.
  std::string speculative_config;

  // Tokens per engine step: --max-num-batched-tokens, else default_batched_tokens(gpu) (the
  // device's; gpu_memory_bytes 0: the CPU), or with chunked prefill off max(max_model_len, that).
  int batched_tokens(int64_t max_model_len, int64_t gpu_memory_bytes, std::string_view gpu_name) const;
};

// vLLM `serve`'s step budget when --max-num-batched-tokens is unset: 8192 tokens on a GPU of at
// least 70 GiB other than an A100 (H100, H200), else 2048 (smaller GPUs, the CPU: pass 0 bytes).
// On Hopper it matters beyond compatibility: a 2,048-token chunk leaves an M3.1 expert ~64 rows,
// where the routed MoE takes about as long as at 8,192 tokens (docs/gpu-backend-notes.md
// "Serving chunk size").
int default_batched_tokens(int64_t gpu_memory_bytes, std::string_view gpu_name);

void add_model_options(CLI::App& cmd, ModelOptions& options);
void add_engine_options(CLI::App& cmd, EngineOptions& options);

// The checks that need neither the model files nor the GPU driver (the loader runs them first;
// serve runs them before it starts any thread). Throw m3::Error naming the option.
void check_model_options(const ModelOptions& options);
void check_engine_options(const EngineOptions& options);
// --speculative-config checked (an error names the key), or nothing when it is not given. A method
// whose drafter m3serve cannot run is an error.
std::optional<SpeculativeConfig> speculative_config(const EngineOptions& options);

// --attention-config, parsed. Unknown keys and keys this build cannot honour (indexer_decode_cp:
// true needs several GPUs) are errors naming them.
struct AttentionConfig {
  std::string indexer_kv_dtype;  // "" when absent: the KV dtype
  bool indexer_decode_cp = false;  // split the indexer's blocks over the -tp ranks (needs -tp > 1)
};
AttentionConfig parse_attention_config(const std::string& json);

// Everything decided from the options and config.json before any weight is read.
struct ModelPlan {
  ModelConfig config;           // with --num-layers applied
  ModelRuntimeOptions runtime;  // dtypes (num_kv_blocks still 0)
  std::string device;           // "cpu" or "cuda"
  KvLayout kv_layout;           // of one rank (its KV heads)
  int64_t max_model_len = 0;    // --max-model-len, else min(max_position_embeddings, 8192)
  ParallelLayout layout;        // which rank holds what (one rank without -tp)
  AttentionConfig attention;
};
ModelPlan plan_model(const ModelOptions& options);

// How large a KV pool a command wants when neither --num-kv-blocks nor --kv-cache-memory gives
// its size: room for `sequences` sequences of `tokens_per_sequence` tokens (0: the max model
// length) at once, within the device's budget. The budget is 1 GiB on the CPU (never less than
// one sequence) and, on the GPU, --gpu-memory-utilization (default 0.9) of its memory less what is
// in use (weights) and the activations of the engine options' step. whole_gpu_budget takes the
// whole GPU budget whatever the demand (serve, as vLLM does).
struct KvDemand {
  int64_t sequences = 1;
  int64_t tokens_per_sequence = 0;
  bool whole_gpu_budget = false;
};

// One rank of a loaded model: its backend, its tensor-parallel group and its partition.
struct RankModel {
  std::unique_ptr<Backend> backend;  // the device backend
  // A wrapper the model runs on instead of `backend` (bench latency's per-op timing), or null.
  std::unique_ptr<Backend> wrapper;
  std::unique_ptr<Communicator> tp;  // null on one rank; under DEP the ranks of this rank's copy
  // Data-parallel attention: the ranks with this rank's tp rank in every copy (every rank with
  // -tp 1), null otherwise; and the same ranks over host memory (Gloo).
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> ep_host;
  std::unique_ptr<MiniMaxM3> model;
};

struct LoadedModel {
  std::vector<RankModel> ranks;          // this process's ranks, by rank; one without -tp
  std::unique_ptr<RankWorkers> workers;  // a thread per rank when the layout has several
  // DEP with -tp > 1: a thread per rank of each copy (copy_workers[d] runs ranks d * tp ..), so
  // each engine lane drives its copy's ranks while the other lanes drive theirs.
  std::vector<std::unique_ptr<RankWorkers>> copy_workers;
  std::string device;
  int64_t max_model_len = 0;  // the plan's
  // Tokens per engine step: --max-num-batched-tokens, else this GPU's default (the smallest over
  // the nodes, so that no node's activation reserve is short of it).
  int max_num_batched_tokens = 0;
  ParallelLayout layout;      // of every rank, on every node
  int first_rank = 0;         // global rank of ranks[0] (node_rank * ranks per node)
  // DEP over several hosts, by copy: on node 0 the channel to each copy another node holds, on
  // that node the channel of each of its copies; null elsewhere (declared after the ranks, so
  // node 0's stop goes out before they are torn down).
  std::vector<std::unique_ptr<ControlGroup>> copy_channels;
  // Several hosts: the group node 0 relays its steps over (declared last, so node 0's stop goes
  // out before its ranks are torn down). Null on one host.
  std::unique_ptr<ControlGroup> control;

  // Node 0 of several hosts: why the deployment is broken, once a message to another node failed
  // (its control group or a copy's channel; parallel/control_group.h lost()); else nullopt.
  std::optional<std::string> lost_node() const;
  // A process of node R > 0: it runs node 0's steps (follow_node_zero) instead of the command.
  bool follower() const { return control && !control->leader(); }
  // This process's first rank's model: the config, KV geometry and options every rank shares.
  MiniMaxM3& model() const { return *ranks.front().model; }
  // The runner over every rank (engine/minimax_m3_runner.h); this LoadedModel must outlive it.
  // Data-parallel copies have no single runner (make_engine gives each its engine lane).
  std::unique_ptr<ModelRunner> make_runner() const;
  // DEP: a runner per copy this process holds (its one rank, or its -tp ranks on copy_workers),
  // in copy order; they are data-parallel ranks first_copy() ...
  std::vector<std::unique_ptr<ModelRunner>> make_copy_runners() const;
  int first_copy() const { return first_rank / layout.config.tensor_parallel_size; }
};

// Loads config and weights (a progress bar on a terminal), cuts them into the ranks' slices
// (model/weight_shard.h), places each on its rank's backend, sizes the KV pools (demand, engine
// options; the same block count on every rank, what the smallest budget holds) and builds the
// rank models. wrap, when given, makes the backend each rank runs on from its device backend.
// Called on each rank's thread with its device backend and its (global) rank.
// Several hosts: every node reads the checkpoint and keeps only its ranks' slices; the groups
// meet through the TCP store on node 0 (parallel/tcp_store.h), each rank's Gloo transport
// listening on the address of the interface that routes to --master-addr; the KV pool is the
// smallest over every node's ranks. On node R > 0 the result is a follower().
using BackendWrapper = std::function<std::unique_ptr<Backend>(Backend&, int rank)>;
LoadedModel load_model(const ModelOptions& options, const EngineOptions& engine, const KvDemand& demand,
                       const BackendWrapper& wrap = {});

// --speculative-config method dspark: a drafter on each runner's rank 0 backend (one per copy of
// the model: each has its own pool), its cache beside the target's. It shares the target's
// embedding and lm_head where rank 0 holds them whole; a vocab-parallel rank 0 gets whole copies
// from the checkpoint's files (opened once). make_engine calls it for the copies of this process;
// a follower node for the DEP copies it holds (app/node_follower).
void attach_dspark(const std::vector<MiniMaxM3Runner*>& runners, const LoadedModel& loaded, const ModelOptions& options,
                   const SpeculativeConfig& spec);

// The engine over a loaded model (not started); not on a follower. max_model_len: the plan's when --max-model-len
// was given (the constructor then rejects a pool too small for it), else capped at what the KV
// pool holds.
std::unique_ptr<EngineCore> make_engine(LoadedModel& loaded, const ModelOptions& options, const EngineOptions& engine);

// Binds the calling thread (a rank's, a lane's) to GPU `device`; m3::Error in a build without CUDA.
void use_device(int device);

// --device: "cpu" or "cuda" as given; "auto" is cuda when this build has the CUDA backend, a
// usable Hopper GPU is present and the activations are bfloat16 (the GPU's only activation
// dtype), else cpu. Throws m3::Error for other names, or for cuda without a usable GPU.
std::string resolve_device(const std::string& device, DType activation_dtype);

// "512MiB", "2GiB", "1.5G", "4096" -> bytes; throws m3::Error naming the option otherwise.
int64_t parse_memory_size(const std::string& text, const std::string& option);

}  // namespace m3::app
