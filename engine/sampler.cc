#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace m3 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void apply_penalties(std::vector<float>& logits, const SamplingState& state) {
  const SamplingParams& p = *state.params;
  const int vocab = static_cast<int>(logits.size());
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    auto penalise = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& x = logits[id];
      x = x > 0.0f ? x / r : x * r;
    };
    for (int32_t id : state.prompt_token_set) penalise(id);
    if (state.output_counts) {
      for (const auto& [id, count] : *state.output_counts) {
        if (!std::binary_search(state.prompt_token_set.begin(), state.prompt_token_set.end(), id)) penalise(id);
      }
    }
  }
  if ((p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) && state.output_counts) {
    for (const auto& [id, count] : *state.output_counts) {
      if (id < 0 || id >= vocab || count <= 0) continue;
      logits[id] -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
    }
  }
}

// First index of the largest value (NaN never wins); 0 when nothing is larger than -inf.
// Two passes: an 8-lane max the compiler turns into SIMD (a host-side 200K-vocab argmax per
// request and step must cost microseconds), then the first index holding it.
int32_t argmax(std::span<const float> values) {
  constexpr int kLanes = 8;
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, kNegInf);
  const std::size_t n = values.size();
  const std::size_t body = n - n % kLanes;
  for (std::size_t i = 0; i < body; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lane_max[k] = values[i + k] > lane_max[k] ? values[i + k] : lane_max[k];
  }
  float best = kNegInf;
  for (int k = 0; k < kLanes; ++k) best = lane_max[k] > best ? lane_max[k] : best;
  for (std::size_t i = body; i < n; ++i) best = values[i] > best ? values[i] : best;
  if (!(best > kNegInf)) return 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (values[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

}  // namespace

double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(counter));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingState& state) {
  const SamplingParams& p = *state.params;
  const int vocab = static_cast<int>(logits.size());
  const bool masking = state.output_index < p.min_tokens && !state.min_tokens_masked.empty();
  const bool penalised = p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  if (p.greedy() && !masking && !penalised) return argmax(logits);  // the common case: no copy

  work_.assign(logits.begin(), logits.end());
  if (masking) {
    for (int32_t id : state.min_tokens_masked) {
      if (id >= 0 && id < vocab) work_[id] = kNegInf;
    }
  }
  if (penalised) apply_penalties(work_, state);
  if (p.greedy()) return argmax(work_);

  // Temperature, then min_p relative to the most likely token: p_i >= min_p * p_max is
  // exp(x_i - x_max) >= min_p.
  const float inv_temperature = 1.0f / p.temperature;
  float max_logit = kNegInf;
  for (float& x : work_) {
    x *= inv_temperature;
    if (x > max_logit) max_logit = x;
  }
  if (!std::isfinite(max_logit)) return argmax(logits);  // everything masked or broken: fall back
  order_.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = work_[i];
    if (!(x > kNegInf)) continue;
    if (p.min_p > 0.0f && std::exp(static_cast<double>(x) - max_logit) < p.min_p) continue;
    order_.push_back(i);
  }
  auto by_logit_desc = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  // top_k keeps every token tied with the k-th largest value, as vLLM's threshold mask does.
  if (p.top_k > 0 && p.top_k < static_cast<int>(order_.size())) {
    std::nth_element(order_.begin(), order_.begin() + (p.top_k - 1), order_.end(), by_logit_desc);
    const float threshold = work_[order_[p.top_k - 1]];
    std::erase_if(order_, [&](int32_t id) { return work_[id] < threshold; });
    std::sort(order_.begin(), order_.end());  // back to id order
  }
  prob_.resize(vocab);  // unnormalised probabilities, valid for the ids in order_
  double total = 0.0;
  for (int32_t id : order_) total += prob_[id] = std::exp(static_cast<double>(work_[id]) - max_logit);

  if (p.top_p < 1.0f) {
    // vLLM: sort ascending, drop the tokens whose ascending cumulative probability is <= 1 - top_p,
    // always keep the most likely one. Tokens with probability <= (1 - top_p) / n are dropped
    // for sure (all of them together weigh at most 1 - top_p and they come first in ascending
    // order), so only the others need sorting: few, for a peaked distribution.
    const double drop_mass = (1.0 - static_cast<double>(p.top_p)) * total;
    const double surely_dropped = drop_mass / static_cast<double>(order_.size());
    double tail = 0.0;
    std::erase_if(order_, [&](int32_t id) {
      if (prob_[id] > surely_dropped) return false;
      tail += prob_[id];
      return true;
    });
    std::sort(order_.begin(), order_.end(), by_logit_desc);
    std::size_t keep = order_.size();
    for (std::size_t j = order_.size(); j-- > 1;) {
      tail += prob_[order_[j]];
      if (tail > drop_mass) break;
      keep = j;
    }
    order_.resize(keep);
    // The draw walks in token-id order: a descending-probability order would let two nearly tied
    // logits swap places under 1e-6 noise (batch-dependent rounding) and move a large CDF slice.
    std::sort(order_.begin(), order_.end());
    total = 0.0;
    for (int32_t id : order_) total += prob_[id];
  }

  const double target = counter_uniform(state.seed, static_cast<uint64_t>(state.output_index)) * total;
  double cumulative = 0.0;
  for (int32_t id : order_) {
    cumulative += prob_[id];
    if (cumulative > target) return id;
  }
  return order_.back();
}

PositionLogprobs Sampler::logprobs(std::span<const float> logits, int32_t token, int k) {
  const int vocab = static_cast<int>(logits.size());
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_norm = max_logit + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - log_norm); };

  PositionLogprobs out;
  out.token_id = token;
  out.logprob = logprob(token);
  const float token_logit = logits[token];
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float x) { return x > token_logit; }));
  k = std::min(k, vocab);
  if (k > 0) {
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    out.top.reserve(k);
    for (int j = 0; j < k; ++j) out.top.push_back({order_[j], logprob(order_[j])});
  }
  return out;
}

}  // namespace m3
