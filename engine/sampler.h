// Turns one row of raw logits into the next token, with vLLM's semantics and order:
//   min_tokens mask (eos / stop ids -> -inf) -> repetition, frequency, presence penalties ->
//   greedy argmax (ties: lowest id)  |  temperature -> min_p -> top_k -> top_p -> draw.
// The draw is an inverse-CDF walk over the kept tokens in token-id order with one uniform number
// that depends only on (seed, output index): a seeded request samples the same tokens whatever
// shares its batch, across runs and after preemption. Walking in id order keeps the draw stable
// under tiny logit noise (a token's CDF slice moves by about the noise, never by a neighbour's
// whole probability as it would in a sorted order).
// Logprobs are log_softmax of the raw logits (vLLM's default "raw_logprobs").
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

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

// Uniform in [0, 1) from (seed, counter), counter-based (splitmix64 finaliser).
double counter_uniform(uint64_t seed, uint64_t counter);

class Sampler {
 public:
  // Returns the chosen token id. `logits` is not modified.
  int32_t sample(std::span<const float> logits, const SamplingState& state);
  // log_softmax(logits)[token], its rank, and the top k (k may be 0).
  PositionLogprobs logprobs(std::span<const float> logits, int32_t token, int k);

 private:
  std::vector<float> work_;        // penalised / tempered logits
  std::vector<int32_t> order_;     // candidate ids
  std::vector<double> prob_;       // [vocab] unnormalised probabilities of the candidates
};

}  // namespace m3
