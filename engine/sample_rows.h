// The engine's side of sampling: a request's state -> a SampleRow of the step's SampleBatch
// (ops/sampling.h defines the semantics: mask -> logit bias -> penalties -> greedy | temperature -> min_p ->
// top_k -> top_p -> draw; the backend samples the batch and answers its logprob rows), a backend's
// logprobs -> a request's, and one row by the reference (runners without a backend, tests).
// Logprobs are log_softmax of the raw logits (vLLM's default "raw_logprobs").
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "ops/sampling.h"

namespace m3 {

// What the sampler needs to know about the request besides the logits.
struct SamplingState {
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;
  int output_index = 0;  // index of the token being drawn among the request's outputs
  std::span<const int32_t> prompt_token_set;  // sorted unique prompt ids
  const std::unordered_map<int32_t, int32_t>* output_counts = nullptr;
  // Tokens masked while output_index < min_tokens (stop ids, and eos unless ignore_eos).
  std::span<const int32_t> min_tokens_masked;
};

// The row's parameters (lists left empty) as SampleRow.
SampleRow sample_row_params(const SamplingState& state, int32_t logits_row);

// Appends the row of `state` to `batch` with the lists its parameters use (prompt ids only under a
// repetition penalty, output counts only under a penalty, masked ids only below min_tokens, the
// request's logit bias).
void add_sample_row(SampleBatch& batch, int32_t logits_row, const SamplingState& state);

// A request's logprobs of `token` from the backend's answer for its row (ops/sampling.h
// RowLogprobs). m3::Error when the row was not asked about `token`.
PositionLogprobs position_logprobs(const RowLogprobs& row, int32_t token);

class HostSampler {
 public:
  // The token the backend would sample for `state` (the row add_sample_row builds, through
  // sample_batch_reference). `logits` is not modified.
  int32_t sample(std::span<const float> logits, const SamplingState& state);

 private:
  SampleBatch batch_;  // the one row of sample()
  SampleWorkspace ws_;
};

}  // namespace m3
