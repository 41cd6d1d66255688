#include "engine/sample_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace m3 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool masking(const SamplingState& state) {
  return state.output_index < state.params->min_tokens && !state.min_tokens_masked.empty();
}

// Distinct output ids and their counts, in the map's order (the semantics do not depend on it).
void flatten_counts(const SamplingState& state, std::vector<int32_t>& ids, std::vector<int32_t>& counts) {
  ids.clear();
  counts.clear();
  if (!state.output_counts) return;
  for (const auto& [id, count] : *state.output_counts) {
    ids.push_back(id);
    counts.push_back(count);
  }
}

}  // namespace

SampleRow sample_row_params(const SamplingState& state, int32_t logits_row) {
  const SamplingParams& p = *state.params;
  SampleRow row;
  row.logits_row = logits_row;
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.top_k = p.top_k;
  row.min_p = p.min_p;
  row.repetition_penalty = p.repetition_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.presence_penalty = p.presence_penalty;
  row.seed = state.seed;
  row.output_index = state.output_index;
  return row;
}

void add_sample_row(SampleBatch& batch, int32_t logits_row, const SamplingState& state) {
  const SampleRow row = sample_row_params(state, logits_row);
  const std::span<const int32_t> prompt =
      row.repetition_penalty != 1.0f ? state.prompt_token_set : std::span<const int32_t>();
  const std::span<const int32_t> masked = masking(state) ? state.min_tokens_masked : std::span<const int32_t>();
  std::vector<int32_t> output_ids, output_counts;
  if (sample_row_penalised(row)) flatten_counts(state, output_ids, output_counts);
  const SamplingParams& p = *state.params;
  batch.add(row, prompt.data(), static_cast<int32_t>(prompt.size()), output_ids.data(), output_counts.data(),
            static_cast<int32_t>(output_ids.size()), masked.data(), static_cast<int32_t>(masked.size()),
            p.logit_bias_ids.data(), p.logit_bias_values.data(), static_cast<int32_t>(p.logit_bias_ids.size()));
}

int32_t HostSampler::sample(std::span<const float> logits, const SamplingState& state) {
  batch_.clear();
  add_sample_row(batch_, 0, state);
  int32_t id = 0;
  sample_batch_reference(logits.data(), 1, static_cast<int32_t>(logits.size()), batch_, &id, ws_);
  return id;
}

RowLogSoftmax row_log_softmax(std::span<const float> logits, int k) {
  RowLogSoftmax row;
  float max_logit = kNegInf;
  for (float x : logits) max_logit = std::max(max_logit, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  row.log_norm = max_logit + std::log(sum);
  // The k best in one pass: ids come in ascending order, so a later id enters only with a strictly
  // larger logit than the k-th kept (ties go to the lower id).
  k = std::clamp(k, 0, static_cast<int>(logits.size()));
  std::vector<int32_t>& top = row.top;
  top.reserve(k);
  for (int32_t id = 0; id < static_cast<int32_t>(logits.size()) && k > 0; ++id) {
    const float x = logits[id];
    if (static_cast<int>(top.size()) == k && !(x > logits[top.back()])) continue;
    if (static_cast<int>(top.size()) == k) top.pop_back();
    auto at = top.end();
    while (at != top.begin() && x > logits[*(at - 1)]) --at;
    top.insert(at, id);
  }
  return row;
}

PositionLogprobs position_logprobs(std::span<const float> logits, const RowLogSoftmax& row, int32_t token) {
  auto logprob = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - row.log_norm); };
  PositionLogprobs out;
  out.token_id = token;
  out.logprob = logprob(token);
  const float token_logit = logits[token];
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float x) { return x > token_logit; }));
  out.top.reserve(row.top.size());
  for (int32_t id : row.top) out.top.push_back({id, logprob(id)});
  return out;
}

}  // namespace m3
