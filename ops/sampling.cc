#include "ops/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace m3 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void apply_penalties(std::vector<float>& logits, const SampleRow& p, const int32_t* prompt_ids,
                     const int32_t* output_ids, const int32_t* output_counts) {
  const int vocab = static_cast<int>(logits.size());
  const int32_t* prompt_end = prompt_ids + p.num_prompt;
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    auto penalise = [&](int32_t id) {
      if (id < 0 || id >= vocab) return;
      float& x = logits[id];
      x = x > 0.0f ? x / r : x * r;
    };
    for (int i = 0; i < p.num_prompt; ++i) penalise(prompt_ids[i]);
    for (int i = 0; i < p.num_output; ++i) {
      if (!std::binary_search(prompt_ids, prompt_end, output_ids[i])) penalise(output_ids[i]);
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int i = 0; i < p.num_output; ++i) {
      const int32_t id = output_ids[i], count = output_counts[i];
      if (id < 0 || id >= vocab || count <= 0) continue;
      logits[id] -= p.frequency_penalty * static_cast<float>(count) + p.presence_penalty;
    }
  }
}

// The row's allowed mask (null: none), after checking that its lists lie inside the batch's.
const uint32_t* checked_allowed_mask(const SampleRow& row, const SampleBatch& batch) {
  const uint32_t* allowed = batch.allowed_mask(row);
  M3_CHECK(!allowed || (row.allowed_row + 1) * size_t(batch.allowed_words) <= batch.allowed.size(),
           "sample: a row's allowed mask {} is outside the batch's", row.allowed_row);
  M3_CHECK(row.num_bias == 0 || batch.biases.size() == batch.ids.size(), "sample: {} ids but {} biases",
           batch.ids.size(), batch.biases.size());
  return allowed;
}

}  // namespace

void SampleBatch::add(SampleRow row, const int32_t* prompt_ids, int32_t num_prompt, const int32_t* output_ids,
                      const int32_t* output_counts, int32_t num_output, const int32_t* masked_ids,
                      int32_t num_masked, const int32_t* bias_ids, const float* bias_values, int32_t num_bias) {
  auto append = [&](const int32_t* list, const int32_t* list_counts, const float* list_biases, int32_t n,
                    int32_t& begin, int32_t& num) {
    begin = static_cast<int32_t>(ids.size());
    num = n;
    if (n == 0) return;
    ids.insert(ids.end(), list, list + n);
    if (list_counts) counts.insert(counts.end(), list_counts, list_counts + n);
    else counts.insert(counts.end(), static_cast<size_t>(n), 0);
    if (list_biases) biases.insert(biases.end(), list_biases, list_biases + n);
    else biases.insert(biases.end(), static_cast<size_t>(n), 0.0f);
  };
  append(prompt_ids, nullptr, nullptr, num_prompt, row.prompt_begin, row.num_prompt);
  append(output_ids, output_counts, nullptr, num_output, row.output_begin, row.num_output);
  append(masked_ids, nullptr, nullptr, num_masked, row.masked_begin, row.num_masked);
  append(bias_ids, nullptr, bias_values, num_bias, row.bias_begin, row.num_bias);
  rows.push_back(row);
}

int32_t SampleBatch::add_allowed_row(int32_t words) {
  if (allowed_words == 0) allowed_words = words;
  M3_CHECK(words == allowed_words, "sample batch: allowed masks of {} and {} words", allowed_words, words);
  const auto row = static_cast<int32_t>(allowed.size() / static_cast<size_t>(words));
  allowed.resize(allowed.size() + static_cast<size_t>(words), 0u);
  return row;
}

void check_logprob_rows(const SampleBatch& batch, int64_t num_rows, int32_t vocab, const RowLogprobs* out) {
  M3_CHECK(batch.logprobs.empty() || out != nullptr, "logprobs: {} rows asked for and nowhere to put them",
           batch.logprobs.size());
  const auto drawn_rows = static_cast<int32_t>(batch.rows.size());
  for (size_t j = 0; j < batch.logprobs.size(); ++j) {
    const LogprobRow& q = batch.logprobs[j];
    M3_CHECK(q.logits_row >= 0 && q.logits_row < num_rows, "logprobs: row {} reads logits row {} of {}", j,
             q.logits_row, num_rows);
    M3_CHECK(q.top_k >= 0 && q.top_k <= kMaxTopLogprobs, "logprobs: row {} asks for the top {} (0..{})", j, q.top_k,
             kMaxTopLogprobs);
    for (int t = 0; t < 2; ++t) {
      M3_CHECK(q.drawn_by[t] >= -1 && q.drawn_by[t] < drawn_rows, "logprobs: row {} names the draw of row {} of {}",
               j, q.drawn_by[t], drawn_rows);
      M3_CHECK(q.drawn_by[t] >= 0 || (q.token[t] >= -1 && q.token[t] < vocab),
               "logprobs: row {} asks about token {} of a vocabulary of {}", j, q.token[t], vocab);
    }
  }
}

void logprob_row_tokens(const LogprobRow& q, const int32_t* ids, int32_t (&tokens)[2]) {
  for (int t = 0; t < 2; ++t) tokens[t] = q.drawn_by[t] >= 0 ? ids[q.drawn_by[t]] : q.token[t];
}

void logprob_row_reference(const float* logits, int32_t vocab, const LogprobRow& q, const int32_t* ids,
                           RowLogprobs& out) {
  int32_t tokens[2];
  logprob_row_tokens(q, ids, tokens);
  row_logprobs_reference(logits + q.logits_row * int64_t(vocab), vocab, q.top_k, tokens, out);
}

void row_logprobs_reference(const float* logits, int32_t vocab, int32_t top_k, const int32_t (&tokens)[2],
                            RowLogprobs& out) {
  float max_logit = kNegInf;
  for (int32_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_norm = max_logit + std::log(sum);
  const auto logprob = [&](int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) - log_norm); };
  out = RowLogprobs{};
  for (int t = 0; t < 2; ++t) {
    const int32_t token = tokens[t];
    out.token[t] = token;
    if (token < 0 || token >= vocab) continue;  // none (a drawn id is always inside)
    out.logprob[t] = logprob(token);
    const float x = logits[token];
    out.rank[t] = 1 + static_cast<int32_t>(std::count_if(logits, logits + vocab, [&](float y) { return y > x; }));
  }
  // The k best in one pass over ascending ids, kept sorted: a later id enters only when it beats the
  // k-th kept. "Beats": a larger logit, NaN below everything (so a lower id wins every tie).
  const auto beats = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (std::isnan(logits[b]) && !std::isnan(logits[a])); };
  const int k = std::min(top_k, vocab);
  out.num_top = k;
  int n = 0;
  for (int32_t id = 0; id < vocab && k > 0; ++id) {
    if (n == k && !beats(id, out.top_id[k - 1])) continue;
    int at = n == k ? k - 1 : n++;
    while (at > 0 && beats(id, out.top_id[at - 1])) {
      out.top_id[at] = out.top_id[at - 1];
      --at;
    }
    out.top_id[at] = id;
  }
  for (int i = 0; i < k; ++i) out.top_logprob[i] = logprob(out.top_id[i]);
}

void logprobs_batch_reference(const float* logits, int64_t num_rows, int32_t vocab, const SampleBatch& batch,
                              const int32_t* ids, RowLogprobs* out) {
  check_logprob_rows(batch, num_rows, vocab, out);
  for (size_t j = 0; j < batch.logprobs.size(); ++j) logprob_row_reference(logits, vocab, batch.logprobs[j], ids, out[j]);
}

// Two passes: an 8-lane max the compiler turns into SIMD (a host-side 200K-vocab argmax per
// request and step must cost microseconds), then the first index holding it.
int32_t argmax_reference(const float* values, int64_t n) {
  constexpr int kLanes = 8;
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, kNegInf);
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) lane_max[k] = values[i + k] > lane_max[k] ? values[i + k] : lane_max[k];
  }
  float best = kNegInf;
  for (int k = 0; k < kLanes; ++k) best = lane_max[k] > best ? lane_max[k] : best;
  for (int64_t i = body; i < n; ++i) best = values[i] > best ? values[i] : best;
  if (!(best > kNegInf)) return 0;
  for (int64_t i = 0; i < n; ++i) {
    if (values[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

void sample_batch_reference(const float* logits, int64_t num_rows, int32_t vocab, const SampleBatch& batch,
                            int32_t* ids, SampleWorkspace& ws) {
  batch.wait_masks();
  M3_CHECK(batch.allowed.empty() || int64_t(batch.allowed_words) * 32 >= vocab,
           "sample: allowed masks of {} words cannot cover a vocabulary of {}", batch.allowed_words, vocab);
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const SampleRow& row = batch.rows[i];
    M3_CHECK(row.logits_row >= 0 && row.logits_row < num_rows, "sample: row {} reads logits row {} of {}", i,
             row.logits_row, num_rows);
    ids[i] = sample_reference(logits + int64_t(row.logits_row) * vocab, vocab, row, batch, ws);
  }
}

int32_t sample_reference(const float* logits, int32_t vocab, const SampleRow& row, const SampleBatch& batch,
                         SampleWorkspace& ws, SampleTrace* trace) {
  const int32_t* ids = batch.ids.data();
  const uint32_t* allowed = checked_allowed_mask(row, batch);
  return sample_reference(logits, vocab, row, ids + row.prompt_begin, ids + row.output_begin,
                          batch.counts.data() + row.output_begin, ids + row.masked_begin, ids + row.bias_begin,
                          row.num_bias ? batch.biases.data() + row.bias_begin : nullptr, allowed, ws, trace);
}

namespace {

// What a row samples from: a fixed id (greedy rows, and rows with nothing left to draw), else the
// kept candidates ws.order in ascending id order with unnormalised probabilities ws.prob[id]
// summing to `total`.
struct Kept {
  int32_t fixed = -1;
  double total = 0.0;
};

Kept keep_candidates(const float* logits, int32_t vocab, const SampleRow& p, const int32_t* prompt_ids,
                     const int32_t* output_ids, const int32_t* output_counts, const int32_t* masked_ids,
                     const int32_t* bias_ids, const float* bias_values, const uint32_t* allowed,
                     SampleWorkspace& ws, SampleTrace* trace) {
  const bool masking = p.num_masked > 0 || allowed || sample_row_biased(p);
  const bool penalised = sample_row_penalised(p);
  const bool greedy = sample_row_greedy(p);
  if (greedy && !masking && !penalised) return {argmax_reference(logits, vocab)};  // the common case: no copy

  std::vector<float>& work = ws.work;
  work.assign(logits, logits + vocab);
  if (allowed) {
    for (int32_t i = 0; i < vocab; ++i)
      if (!((allowed[i >> 5] >> (i & 31)) & 1u)) work[i] = kNegInf;
  }
  for (int i = 0; i < p.num_masked; ++i) {
    const int32_t id = masked_ids[i];
    if (id >= 0 && id < vocab) work[id] = kNegInf;
  }
  for (int i = 0; i < p.num_bias; ++i) {
    const int32_t id = bias_ids[i];
    if (id >= 0 && id < vocab) work[id] += bias_values[i];
  }
  if (penalised) apply_penalties(work, p, prompt_ids, output_ids, output_counts);
  if (greedy) return {argmax_reference(work.data(), vocab)};

  // Temperature, then min_p relative to the most likely token: p_i >= min_p * p_max is
  // exp(x_i - x_max) >= min_p.
  const float inv_temperature = 1.0f / p.temperature;
  float max_logit = kNegInf;
  for (float& x : work) {
    x *= inv_temperature;
    if (x > max_logit) max_logit = x;
  }
  if (!std::isfinite(max_logit)) return {argmax_reference(logits, vocab)};  // everything masked or broken
  std::vector<int32_t>& order = ws.order;
  order.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    const float x = work[i];
    if (!(x > kNegInf)) continue;
    if (p.min_p > 0.0f) {
      const double rel = std::exp(static_cast<double>(x) - max_logit);
      if (trace) trace->min_p_margin = std::min(trace->min_p_margin, std::abs(rel - p.min_p));
      if (rel < p.min_p) continue;
    }
    order.push_back(i);
  }
  auto by_logit_desc = [&](int32_t a, int32_t b) { return work[a] > work[b] || (work[a] == work[b] && a < b); };
  // top_k keeps every token tied with the k-th largest value, as vLLM's threshold mask does.
  if (p.top_k > 0 && p.top_k < static_cast<int>(order.size())) {
    std::nth_element(order.begin(), order.begin() + (p.top_k - 1), order.end(), by_logit_desc);
    const float threshold = work[order[p.top_k - 1]];
    std::erase_if(order, [&](int32_t id) { return work[id] < threshold; });
    std::sort(order.begin(), order.end());  // back to id order
  }
  std::vector<double>& prob = ws.prob;
  prob.resize(vocab);  // unnormalised probabilities, valid for the ids in order
  double total = 0.0;
  for (int32_t id : order) total += prob[id] = std::exp(static_cast<double>(work[id]) - max_logit);

  if (p.top_p < 1.0f) {
    // vLLM: sort ascending, drop the tokens whose ascending cumulative probability is <= 1 - top_p,
    // always keep the most likely one. Tokens with probability <= (1 - top_p) / n are dropped
    // for sure (all of them together weigh at most 1 - top_p and they come first in ascending
    // order), so only the others need sorting: few, for a peaked distribution.
    const double drop_mass = (1.0 - static_cast<double>(p.top_p)) * total;
    const double surely_dropped = drop_mass / static_cast<double>(order.size());
    double tail = 0.0;
    std::erase_if(order, [&](int32_t id) {
      if (prob[id] > surely_dropped) return false;
      tail += prob[id];
      return true;
    });
    std::sort(order.begin(), order.end(), by_logit_desc);
    std::size_t keep = order.size();
    for (std::size_t j = order.size(); j-- > 1;) {
      const double before = tail;
      tail += prob[order[j]];
      if (trace) trace->top_p_margin = std::min(trace->top_p_margin, std::abs(tail - drop_mass) / total);
      if (tail > drop_mass) break;
      if (trace) trace->top_p_margin = std::min(trace->top_p_margin, std::abs(drop_mass - before) / total);
      keep = j;
    }
    order.resize(keep);
    // The draw walks in token-id order: a descending-probability order would let two nearly tied
    // logits swap places under 1e-6 noise (batch-dependent rounding) and move a large CDF slice.
    std::sort(order.begin(), order.end());
    total = 0.0;
    for (int32_t id : order) total += prob[id];
  }
  return {-1, total};
}

// The one draw: the candidate whose slice of the cumulative mass, walked in id order, holds
// u * total (id_at(i) ascending, mass_at(i) its unnormalised probability).
template <class IdAt, class MassAt>
int32_t draw_in_id_order(size_t n, IdAt id_at, MassAt mass_at, double total, double u, SampleTrace* trace) {
  const double target = u * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double before = cumulative;
    cumulative += mass_at(i);
    if (cumulative > target) {
      if (trace) trace->draw_margin = std::min(target - before, cumulative - target) / total;
      return id_at(i);
    }
  }
  if (trace) trace->draw_margin = 0.0;  // rounding put the target past the last slice
  return id_at(n - 1);
}

void kept_distribution(const Kept& kept, const SampleWorkspace& ws, TokenDistribution& out) {
  out.ids.clear();
  out.mass.clear();
  if (kept.fixed >= 0) {
    out.ids.push_back(kept.fixed);
    out.mass.push_back(1.0);
    out.total = 1.0;
    return;
  }
  out.ids.assign(ws.order.begin(), ws.order.end());
  for (int32_t id : out.ids) out.mass.push_back(ws.prob[id]);
  out.total = kept.total;
}

}  // namespace

int32_t sample_reference(const float* logits, int32_t vocab, const SampleRow& p, const int32_t* prompt_ids,
                         const int32_t* output_ids, const int32_t* output_counts, const int32_t* masked_ids,
                         const int32_t* bias_ids, const float* bias_values, const uint32_t* allowed,
                         SampleWorkspace& ws, SampleTrace* trace) {
  const Kept kept = keep_candidates(logits, vocab, p, prompt_ids, output_ids, output_counts, masked_ids, bias_ids,
                                    bias_values, allowed, ws, trace);
  if (kept.fixed >= 0) return kept.fixed;
  const std::vector<int32_t>& order = ws.order;
  const std::vector<double>& prob = ws.prob;
  return draw_in_id_order(
      order.size(), [&](size_t i) { return order[i]; }, [&](size_t i) { return prob[order[i]]; }, kept.total,
      counter_uniform(p.seed, static_cast<uint64_t>(p.output_index)), trace);
}

void sample_distribution(const float* logits, int32_t vocab, const SampleRow& row, const SampleBatch& batch,
                         SampleWorkspace& ws, TokenDistribution& out) {
  const int32_t* ids = batch.ids.data();
  const uint32_t* allowed = checked_allowed_mask(row, batch);
  const Kept kept = keep_candidates(logits, vocab, row, ids + row.prompt_begin, ids + row.output_begin,
                                    batch.counts.data() + row.output_begin, ids + row.masked_begin,
                                    ids + row.bias_begin, row.num_bias ? batch.biases.data() + row.bias_begin : nullptr,
                                    allowed, ws, nullptr);
  kept_distribution(kept, ws, out);
}

double TokenDistribution::prob(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  if (it == ids.end() || *it != id || !(total > 0.0)) return 0.0;
  return mass[static_cast<size_t>(it - ids.begin())] / total;
}

int32_t TokenDistribution::draw(double u, SampleTrace* trace) const {
  M3_CHECK(!ids.empty(), "draw from an empty token distribution");
  return draw_in_id_order(
      ids.size(), [&](size_t i) { return ids[i]; }, [&](size_t i) { return mass[i]; }, total, u, trace);
}

}  // namespace m3
