// The engine thread's state of one request. Owned by the EngineLoop; the scheduler and the KV
// manager hold plain pointers while it is waiting or running.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "ops/sampling.h"
#include "ops/token_constraint.h"

namespace m3 {

using Clock = std::chrono::steady_clock;

enum class SeqStatus : uint8_t { kWaiting, kRunning, kFinished };

struct Sequence {
  EngineRequest request;  // its prompt_token_ids moved into `tokens`
  std::function<void(const RequestOutput&)> sink;
  uint64_t arrival_order = 0;  // FCFS key: smaller arrived earlier
  uint64_t seed = 0;           // sampling seed (the request's, or drawn at add_request)
  Clock::time_point arrival_time{};
  std::optional<Clock::time_point> first_scheduled_time, first_token_time, last_token_time;
  SeqStatus status = SeqStatus::kWaiting;

  // Prompt followed by the output so far. After preemption all of it is recomputed as prefill.
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;  // tokens whose KV is in the cache (a prefix of `tokens`)
  // Speculative decoding: the drafter's guesses at the tokens after `tokens`, run with the last
  // token in the next step and verified there; never part of `tokens` (nor hashed) until kept.
  std::vector<int32_t> draft_tokens;
  // The distributions the drafter drew draft_tokens from (probabilistic drafts), or empty.
  std::vector<TokenDistribution> draft_rows;

  // KV blocks: block_table[i] holds tokens [i * block_size, (i + 1) * block_size).
  std::vector<int32_t> block_table;
  // block_hashes[i]: hash chain of the full block i of `tokens` (kept for every full block when
  // prefix caching is on, computed once as the block fills).
  std::vector<uint64_t> block_hashes;
  int num_registered_blocks = 0;  // leading blocks of block_table already in the prefix cache

  // Sampling state.
  std::vector<int32_t> prompt_token_set;              // sorted unique prompt ids (repetition penalty)
  std::vector<int32_t> min_tokens_masked;             // stop ids (+ eos unless ignore_eos)
  std::unordered_map<int32_t, int32_t> output_counts;  // presence / frequency penalties
  // Output index where params().forced_tokens begin; -1 while forced_after has not appeared.
  int forced_start = -1;
  // Output length when params().reasoning_end first appeared at its end; -1 while it has not.
  int reasoning_ended_at = -1;
  std::unique_ptr<TokenConstraint> constraint;  // from params().constraint; advanced by every token
  std::vector<PositionLogprobs> prompt_logprobs;      // collected during prefill
  bool prompt_logprobs_sent = false;
  int num_cached_prompt_tokens = -1;  // set on the first schedule
  // Tokens of blocks the prefix match brought back from the host tier (KvManager), so far.
  int num_offload_hit_tokens = 0;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  const SamplingParams& params() const { return request.sampling; }
  // Prompt rows still need logits for prompt_logprobs (so the prefix cache must not be read).
  bool wants_prompt_logprobs() const { return params().prompt_logprobs >= 0 && !prompt_logprobs_sent; }
};

}  // namespace m3
