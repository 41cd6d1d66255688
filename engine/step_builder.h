// Flattens a schedule into the StepBatch the model runs (ops/step_batch.h), and records which
// logits rows belong to whom: a sampling row for each request whose known tokens are all computed
// after this step, and the prompt rows of requests collecting prompt logprobs.
#pragma once
#include <vector>

#include "engine/scheduler.h"
#include "ops/step_batch.h"

namespace m3 {

struct SeqLogitsRows {
  int first_prompt_row = 0;    // logits row of the first prompt-logprob position
  int first_prompt_pos = 0;    // its position (it predicts token first_prompt_pos + 1)
  int num_prompt_rows = 0;
  int sample_row = -1;         // -1: no token is sampled for this request this step
  // Speculative: the request's drafts ran after its last token; rows sample_row .. + num_drafts
  // (consecutive) follow the last token and each draft.
  int num_drafts = 0;
};

struct StepPlan {
  StepBatch batch;
  std::vector<SeqLogitsRows> rows;  // parallel to the schedule
};

// Page-table rows are padded with -1 past each sequence's ceil(seq_len / block_size) pages.
void build_step(const std::vector<ScheduledSeq>& scheduled, int block_size, StepPlan& plan);

}  // namespace m3
