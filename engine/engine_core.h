// EngineCore: continuous batching over one model. One engine thread runs the loop
//   drain the inbox (new requests, aborts) -> Scheduler -> StepBatch ->
//   ModelRunner::forward_sample (forward + Backend::sample) -> sinks
// add_request / abort / stats are thread-safe and cheap: they only touch the inbox (a queue under
// a mutex) or the last published stats snapshot; everything else belongs to the engine thread.
//
// Behaviour the server can rely on:
//   - Scheduling is FCFS with chunked prefill under max_num_batched_tokens and max_num_seqs;
//     running decodes go first. With chunked prefill off a prompt is prefilled in one step
//     (so max_num_batched_tokens must cover max_model_len), except that a request asking for
//     prompt_logprobs still computes its prompt in chunks of logits rows (memory bound). When KV blocks run out the newest running request is preempted
//     and later recomputed (its output so far kept); its outputs are unchanged by this.
//   - Prefix caching reuses full blocks (block_size tokens) of identical token prefixes; at least
//     the last prompt token is always computed. With a runner that has a host tier
//     (ModelRunner::num_host_kv_blocks() > 0) a cached block evicted from the pool is copied to
//     host memory and copied back on a later hit instead of being recomputed (engine/kv_manager.h),
//     with the same outputs as without it. Requests with prompt_logprobs do not read the
//     cache (their prompt rows need logits) but still fill it.
//   - Greedy requests, and seeded ones, give the same tokens alone, in any batch, after
//     preemption and on a prefix-cache hit (given a model whose logits are batch-invariant).
//   - A request without a seed gets one drawn from the engine's generator, seeded by
//     EngineConfig::seed (vLLM's --seed, default 0 as in vLLM V1), in the order add_request
//     accepts them: an engine started with the same seed and given the same requests in the same
//     order samples the same tokens (in any batching, unlike vLLM, whose draws follow the batch).
//   - abort(id): the request's blocks are freed before the next step runs, and its sink gets a
//     final output with reason kAbort (unless it had already finished). Unknown ids are ignored.
//   - A failing step (model error) finishes that step's requests with kError; the engine goes on.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/speculative_config.h"

namespace m3 {

struct EngineConfig {
  int max_num_seqs = 64;               // running requests at most
  int max_num_batched_tokens = 2048;   // tokens per step (decode + prefill chunks); >= max_num_seqs
  // Longest prompt + output. 0: min(model max_position_embeddings, KV pool capacity). A value
  // above either is rejected by the constructor with a message saying what fits.
  int max_model_len = 0;
  bool enable_prefix_caching = true;
  // Off: a prompt is prefilled in one step; max_num_batched_tokens must then be >= max_model_len.
  bool enable_chunked_prefill = true;
  uint64_t seed = 0;  // seeds the draws of the seeds of requests that have none
  // Speculative decoding (--speculative-config): drafts proposed after each step for running
  // requests, verified in the next (engine/engine_loop.h). Empty: off.
  std::optional<SpeculativeConfig> speculative;
};

// vLLM's buckets of vllm:iteration_tokens_total (its list when CUDA-graph sizes are not known).
inline constexpr std::array<int, 13> kIterationTokenBuckets = {1, 8, 16, 32, 64, 128, 256, 512,
                                                               1024, 2048, 4096, 8192, 16384};

// A snapshot, published after every step (vLLM metric names in comments).
struct EngineStats {
  int num_running = 0;  // vllm:num_requests_running
  int num_waiting = 0;  // vllm:num_requests_waiting (preempted ones included)
  int64_t num_kv_blocks = 0;
  int64_t num_used_kv_blocks = 0;  // referenced by a request (cached-but-free blocks are free)
  double kv_usage = 0.0;           // vllm:kv_cache_usage_perc, a fraction in [0, 1]
  uint64_t prompt_tokens_total = 0;      // vllm:prompt_tokens_total (each prompt once, at its first token)
  uint64_t generation_tokens_total = 0;  // vllm:generation_tokens_total
  uint64_t prefix_cache_queries_tokens = 0;  // vllm:prefix_cache_queries_total (prompt tokens looked up)
  uint64_t prefix_cache_hits_tokens = 0;     // vllm:prefix_cache_hits_total
  uint64_t num_preemptions = 0;              // vllm:num_preemptions_total
  // The host tier of the prefix cache (--kv-offloading-size); zeros without one.
  uint64_t external_prefix_cache_queries_tokens = 0;  // vllm:external_prefix_cache_queries_total
  uint64_t external_prefix_cache_hits_tokens = 0;     // vllm:external_prefix_cache_hits_total
  int64_t num_host_kv_blocks = 0;         // m3:kv_offload_host_blocks (slots)
  int64_t num_stored_host_kv_blocks = 0;  // m3:kv_offload_host_blocks_stored
  uint64_t kv_offload_blocks_to_host = 0, kv_offload_blocks_to_device = 0;  // m3:kv_offload_blocks_total
  uint64_t kv_offload_bytes_to_host = 0, kv_offload_bytes_to_device = 0;    // m3:kv_offload_bytes_total
  double kv_offload_seconds_to_host = 0, kv_offload_seconds_to_device = 0;  // m3:kv_offload_seconds_total
  uint64_t kv_offload_blocks_saved_ahead = 0;  // m3:kv_offload_blocks_saved_ahead_total (of blocks to host)
  uint64_t kv_offload_steps_waiting = 0;       // m3:kv_offload_steps_waiting_total
  uint64_t finished_stop = 0;    // vllm:request_success_total{finished_reason="stop"}
  uint64_t finished_length = 0;  // ... "length"
  uint64_t finished_abort = 0;   // ... "abort"
  uint64_t finished_error = 0;
  uint64_t num_steps = 0;
  // Speculative decoding: request-steps that verified drafts, drafts verified, drafts kept, and
  // drafts kept at each place in the step (vllm:spec_decode_num_drafts_total,
  // _num_draft_tokens_total, _num_accepted_tokens_total, _num_accepted_tokens_per_pos_total).
  // Mean acceptance length = 1 + accepted / drafts, counting the target's own token as vLLM does.
  uint64_t spec_num_drafts = 0;
  uint64_t spec_num_draft_tokens = 0;
  uint64_t spec_num_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_pos;  // num_speculative_tokens entries when speculating
  // Adaptive verification (engine/adaptive_verification.h): drafts proposed but not verified
  // (m3:spec_decode_num_unverified_draft_tokens_total), and the last threshold of the running
  // confidence product (m3:spec_decode_verify_threshold; a lane's, the largest over lanes).
  bool spec_adaptive_verification = false;
  uint64_t spec_num_unverified_draft_tokens = 0;
  double spec_verify_threshold = 0.0;
  // vllm:iteration_tokens_total: tokens computed per step (prompt chunks + decodes), as counts per
  // bucket of kIterationTokenBuckets (not cumulative; the last is above the largest bound).
  std::array<uint64_t, kIterationTokenBuckets.size() + 1> iteration_tokens_counts{};
  uint64_t iteration_tokens_sum = 0;
};

using OutputSink = std::function<void(const RequestOutput&)>;

class EngineCore {
 public:
  // Throws m3::Error for an impossible config (e.g. max_model_len larger than the KV pool).
  // The runner is driven only from the engine thread.
  EngineCore(std::unique_ptr<ModelRunner> runner, EngineConfig config);
  // Data-parallel lanes (data-parallel attention): one runner per copy of the model, each with its
  // own thread, scheduler, KV pool and prefix cache; a request runs on the lane with the fewest
  // requests in flight. The lanes step together (engine/step_group.h): a lane with nothing to run
  // joins its peers' steps through ModelRunner::idle_step. on_lane_start(lane) runs first on each
  // lane's thread (bind its device). The config applies to every lane.
  EngineCore(std::vector<std::unique_ptr<ModelRunner>> lanes, EngineConfig config,
             std::function<void(int)> on_lane_start = {});
  ~EngineCore();  // shutdown(false) if still running
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  void start();  // launches the engine thread; add_request works before start (it queues)
  // drain = true: refuse new requests, finish every request in flight, then stop.
  // drain = false: abort everything in flight (sinks get kAbort), then stop. Idempotent.
  void shutdown(bool drain);

  // Validates (SamplingParams::validate, token ids < vocab, prompt non-empty, prompt + max_tokens
  // <= max_model_len, unique id, engine not shut down) and queues the request. Throws m3::Error
  // naming the problem; nothing is queued then. The sink is called on the engine thread (see
  // RequestOutput); it must be quick and must not block on the engine. It may call abort() or
  // add_request() (both only queue).
  void add_request(EngineRequest request, OutputSink sink);
  void abort(const std::string& request_id);

  EngineStats stats() const;  // summed over the lanes
  int max_model_len() const;         // effective limit, after the constructor's resolution
  int64_t kv_capacity_tokens() const;  // num_kv_blocks * block_size, summed over the lanes
  int num_lanes() const;
  int block_size() const;
  int vocab_size() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace m3
