#include "engine/sample_rows.h"

#include "core/error.h"

namespace m3 {
namespace {

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

PositionLogprobs position_logprobs(const RowLogprobs& row, int32_t token) {
  const int t = row.token[0] == token ? 0 : row.token[1] == token ? 1 : -1;
  M3_CHECK(t >= 0 && token >= 0, "logprobs of token {} asked of a row computed for tokens {} and {}", token,
           row.token[0], row.token[1]);
  PositionLogprobs out;
  out.token_id = token;
  out.logprob = row.logprob[t];
  out.rank = row.rank[t];
  out.top.reserve(static_cast<size_t>(row.num_top));
  for (int i = 0; i < row.num_top; ++i) out.top.push_back({row.top_id[i], row.top_logprob[i]});
  return out;
}

}  // namespace m3
