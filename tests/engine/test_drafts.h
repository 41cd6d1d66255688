// Draws for the engine tests' own drafters: one draft from a row of logits, as a drafter with
// probabilistic drafts makes it.
#pragma once
#include <cstdint>
#include <utility>

#include "engine/drafter.h"
#include "ops/rejection_sampling.h"
#include "ops/sampling.h"

namespace m3::test {

// One row shaped as request r's draws are (its temperature and top_p; no penalties or biases),
// for draw_test_draft.
inline SampleBatch test_draft_batch(const DraftRequest& r) {
  SampleRow row;
  row.temperature = r.params->temperature;
  row.top_p = r.params->top_p;
  SampleBatch batch;
  batch.add(row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
  return batch;
}

// Draft j of request r from logits [vocab] under batch.rows[0] (its temperature, its mask if it
// has one): a greedy row's best token, else a draw with draft_uniform whose distribution is
// appended to draft.rows. Returns the id; the caller appends it to draft.tokens.
inline int32_t draw_test_draft(const DraftRequest& r, int j, const float* logits, int32_t vocab,
                               const SampleBatch& batch, SampleWorkspace& ws, Draft& draft) {
  if (sample_row_greedy(batch.rows[0])) return sample_reference(logits, vocab, batch.rows[0], batch, ws);
  TokenDistribution q;
  sample_distribution(logits, vocab, batch.rows[0], batch, ws, q);
  const int32_t id = q.draw(draft_uniform(r.seed, r.output_index + j));
  draft.rows.push_back(std::move(q));
  return id;
}

}  // namespace m3::test
