// Sampling: one logits row -> one token id, with vLLM's semantics and order. The ONE definition
// of the semantics (engine/sample_rows.h and every backend's sample op follow it):
//   allowed-token mask (structured outputs: tokens outside the row's bitmask -> -inf) ->
//   min_tokens mask (listed ids -> -inf) -> logit bias (listed ids += their bias, OpenAI's
//   logit_bias; vLLM applies it with the masks, before the penalties) ->
//   repetition, frequency, presence penalties ->
//   greedy argmax (ties: lowest id)  |  temperature -> min_p -> top_k -> top_p -> draw.
// The draw is an inverse-CDF walk over the kept tokens in token-id order with one uniform number
// that depends only on (seed, output index): a seeded request samples the same tokens whatever
// shares its batch, across runs and after preemption. Walking in id order keeps the draw stable
// under tiny logit noise (a token's CDF slice moves by about the noise, never by a neighbour's
// whole probability as it would in a sorted order).
//
// SampleBatch is plain data (the rows plus flat id lists they point into) so that a backend can
// upload it in one copy and sample every row on the device (kernels/cuda/backend/sampling.cu).
// This header is C++17 and CUDA-includable: the kernel shares SampleRow and counter_uniform.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/hd.h"

namespace m3 {

// One row to sample. Lists live in SampleBatch::ids / counts at [begin, begin + num).
struct SampleRow {
  int32_t logits_row = 0;         // row of the logits tensor
  float temperature = 1.0f;       // < 1e-5: greedy (argmax after mask and penalties)
  float top_p = 1.0f;             // (0, 1]; 1 disables
  int32_t top_k = 0;              // <= 0 disables
  float min_p = 0.0f;             // 0 disables: keeps exp(x - x_max) >= min_p
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t output_index = 0;       // index of the token being drawn among the request's outputs
  int32_t prompt_begin = 0, num_prompt = 0;  // sorted unique prompt ids (repetition penalty only)
  int32_t output_begin = 0, num_output = 0;  // distinct output ids with their counts (> 0)
  int32_t masked_begin = 0, num_masked = 0;  // ids set to -inf (empty once min_tokens is reached)
  int32_t bias_begin = 0, num_bias = 0;      // distinct ids whose logit gets SampleBatch::biases added
  int32_t allowed_row = -1;  // row of SampleBatch::allowed (a structured-output constraint), or -1
};

M3_HD bool sample_row_greedy(const SampleRow& r) { return r.temperature < 1e-5f; }
M3_HD bool sample_row_constrained(const SampleRow& r) { return r.allowed_row >= 0; }
M3_HD bool sample_row_biased(const SampleRow& r) { return r.num_bias > 0; }
M3_HD bool sample_row_penalised(const SampleRow& r) {
  return r.repetition_penalty != 1.0f || r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f;
}

// ---- Logprobs ----
// vLLM's raw logprobs: log_softmax of a logits row as the head wrote it (no mask, bias, penalty or
// temperature). The backend computes them beside the draw, so a step's logprobs leave the device as
// a few numbers per row instead of the row (~200K floats). log_softmax(x)[i] = x[i] - log_norm with
// log_norm = max + log(sum exp(x - max)); the reference sums in double, a device may sum exps of
// floats (the logprobs are floats either way).
inline constexpr int kMaxTopLogprobs = 20;  // OpenAI's top_logprobs limit, also vLLM's default

// A logits row whose logprobs are wanted: its top_k most likely ids, and the logprob and rank of up
// to two tokens. Token j is an id known when the batch is built (token[j] >= 0), or the id the same
// batch draws for rows[drawn_by[j]] (drawn_by[j] >= 0, token[j] then ignored), or none (both -1).
// Two because a speculative verification row emits either its draft or its own draw.
struct LogprobRow {
  int32_t logits_row = 0;
  int32_t top_k = 0;  // 0..kMaxTopLogprobs
  int32_t token[2] = {-1, -1};
  int32_t drawn_by[2] = {-1, -1};
};

// A LogprobRow's answer. Plain words (it travels as its bytes between nodes).
struct RowLogprobs {
  int32_t token[2] = {-1, -1};  // the tokens asked about (drawn ids filled in), -1 for none
  float logprob[2] = {0.0f, 0.0f};
  int32_t rank[2] = {0, 0};     // 1 + number of ids with a strictly larger logit (vLLM's rank)
  int32_t num_top = 0;
  int32_t top_id[kMaxTopLogprobs] = {};  // the most likely ids: descending logit, ties by lower id, NaN last
  float top_logprob[kMaxTopLogprobs] = {};
};

struct SampleBatch {
  std::vector<SampleRow> rows;
  std::vector<LogprobRow> logprobs;  // rows whose logprobs are wanted (any logits row, drawn or not)
  std::vector<int32_t> ids;     // the rows' lists, back to back
  std::vector<int32_t> counts;  // parallel to ids: the count of an output-list id, else 0
  std::vector<float> biases;    // parallel to ids: the logit bias of a bias-list id, else 0
  // Allowed-token bitmasks of the constrained rows, allowed_words words each (bit i % 32 of word
  // i / 32: token i may be sampled). They may be filled on another thread while the forward pass
  // runs: every reader calls wait_masks() before it reads them.
  std::vector<uint32_t> allowed;
  int32_t allowed_words = 0;
  std::function<void()> masks_ready;  // blocks until `allowed` is filled; empty: it already is

  void clear() {
    rows.clear();
    logprobs.clear();
    ids.clear();
    counts.clear();
    biases.clear();
    allowed.clear();
    allowed_words = 0;
    masks_ready = nullptr;
  }
  void wait_masks() const {
    if (masks_ready) masks_ready();
  }
  // Space for one more bitmask of `words` words (zeros: nothing allowed until filled); its row.
  int32_t add_allowed_row(int32_t words);
  const uint32_t* allowed_mask(const SampleRow& row) const {
    return row.allowed_row < 0 ? nullptr : allowed.data() + static_cast<size_t>(row.allowed_row) * allowed_words;
  }
  // Appends `row` (its list fields are overwritten) with copies of the lists. The bias ids must
  // be distinct.
  void add(SampleRow row, const int32_t* prompt_ids, int32_t num_prompt, const int32_t* output_ids,
           const int32_t* output_counts, int32_t num_output, const int32_t* masked_ids, int32_t num_masked,
           const int32_t* bias_ids = nullptr, const float* bias_values = nullptr, int32_t num_bias = 0);
};

// splitmix64 finaliser.
M3_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, counter), counter-based: 53 bits of splitmix64.
M3_HD double counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = splitmix64(seed ^ splitmix64(counter));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// How close the reference's decisions came to a boundary, relative to the kept mass (tests use
// it to tell a rounding-order difference of another implementation from a real disagreement).
struct SampleTrace {
  double draw_margin = 1e300;   // distance of the draw target to the nearest edge of its CDF slice
  double top_p_margin = 1e300;  // distance of the top_p cut's cumulative mass to 1 - top_p
  double min_p_margin = 1e300;  // smallest |exp(x - x_max) - min_p| (relative to 1)
};

// The distribution a row draws from, as the reference keeps it after masks, penalties,
// temperature, min_p, top_k and top_p: the candidates in ascending id order with unnormalised
// probabilities. A greedy row (or one with nothing left to draw) is its one id with mass 1.
// Speculative decoding's verification (ops/rejection_sampling.h) compares these.
struct TokenDistribution {
  std::vector<int32_t> ids;  // ascending
  std::vector<double> mass;  // parallel to ids, > 0
  double total = 0.0;        // sum of mass
  double prob(int32_t id) const;  // mass / total; 0 for an id outside
  // The id whose slice of the cumulative mass, walked in id order, holds u * total (u in [0, 1)):
  // the reference's draw (trace: how near the slice's edges u fell).
  int32_t draw(double u, SampleTrace* trace = nullptr) const;
};

// Scratch of the reference, reused between rows.
struct SampleWorkspace {
  std::vector<float> work;      // penalised / tempered logits
  std::vector<int32_t> order;   // candidate ids
  std::vector<double> prob;     // [vocab] unnormalised probabilities of the candidates
  std::vector<int32_t> output_ids, output_counts;  // staging for callers that flatten maps
};

// The reference: samples `row` from logits[0, vocab) (not modified), lists from `batch`.
int32_t sample_reference(const float* logits, int32_t vocab, const SampleRow& row, const SampleBatch& batch,
                         SampleWorkspace& ws, SampleTrace* trace = nullptr);
// The same with the lists given directly (host pointers; no copy into a batch).
// `allowed`: the row's bitmask (ceil(vocab / 32) words), or null for none.
int32_t sample_reference(const float* logits, int32_t vocab, const SampleRow& row, const int32_t* prompt_ids,
                         const int32_t* output_ids, const int32_t* output_counts, const int32_t* masked_ids,
                         const int32_t* bias_ids, const float* bias_values, const uint32_t* allowed,
                         SampleWorkspace& ws, SampleTrace* trace = nullptr);

// `row` of `batch` over logits[0, vocab): the distribution sample_reference draws from.
void sample_distribution(const float* logits, int32_t vocab, const SampleRow& row, const SampleBatch& batch,
                         SampleWorkspace& ws, TokenDistribution& out);

// Every row of `batch` by the reference from host logits [num_rows, vocab]: ids[i] for
// batch.rows[i]. The one host path: Backend::sample's default, the CPU backend, runners without a
// backend. Throws m3::Error when a row reads outside the logits.
void sample_batch_reference(const float* logits, int64_t num_rows, int32_t vocab, const SampleBatch& batch,
                            int32_t* ids, SampleWorkspace& ws);

// Checks `batch.logprobs` against logits [num_rows, vocab] and their answers' place `out`: rows
// inside the logits, top_k in 0..kMaxTopLogprobs, tokens inside the vocabulary, drawn_by naming a
// row of batch.rows, `out` not null when there are rows. Throws m3::Error naming the first bad one.
void check_logprob_rows(const SampleBatch& batch, int64_t num_rows, int32_t vocab, const RowLogprobs* out);
// The reference for one row: logits[0, vocab) (not modified), the asked tokens as ids (-1: none).
void row_logprobs_reference(const float* logits, int32_t vocab, int32_t top_k, const int32_t (&tokens)[2],
                            RowLogprobs& out);
// The tokens `q` asks about once the batch's draw gave ids[i] for batch.rows[i] (ids may be null
// when no row is drawn from).
void logprob_row_tokens(const LogprobRow& q, const int32_t* ids, int32_t (&tokens)[2]);
// The reference for `q` (checked) over host logits [*, vocab], after the draw gave `ids`.
void logprob_row_reference(const float* logits, int32_t vocab, const LogprobRow& q, const int32_t* ids,
                           RowLogprobs& out);
// Every row of batch.logprobs by the reference from host logits [num_rows, vocab], after the draw:
// out[j] for batch.logprobs[j]. Checks the rows first (check_logprob_rows).
void logprobs_batch_reference(const float* logits, int64_t num_rows, int32_t vocab, const SampleBatch& batch,
                              const int32_t* ids, RowLogprobs* out);

// First index of the largest value (NaN never wins); 0 when nothing is larger than -inf.
int32_t argmax_reference(const float* values, int64_t n);

}  // namespace m3
