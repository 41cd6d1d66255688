#include "engine/step_builder.h"

#include <algorithm>

namespace m3 {

void build_step(const std::vector<ScheduledSeq>& scheduled, int block_size, StepPlan& plan) {
  StepBatch& b = plan.batch;
  b.token_ids.clear();
  b.positions.clear();
  b.token_seq.clear();
  b.query_start.assign(1, 0);
  b.seq_lens.clear();
  b.slot_mapping.clear();
  b.logits_rows.clear();
  plan.rows.assign(scheduled.size(), SeqLogitsRows{});

  int pages_per_seq = 0;
  for (const ScheduledSeq& s : scheduled) {
    const int seq_len = s.seq->num_computed_tokens + s.num_new_tokens;
    pages_per_seq = std::max(pages_per_seq, (seq_len + block_size - 1) / block_size);
  }
  b.pages_per_seq = pages_per_seq;
  b.page_table.assign(scheduled.size() * static_cast<std::size_t>(pages_per_seq), -1);

  for (std::size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& seq = *scheduled[i].seq;
    const int begin = seq.num_computed_tokens;
    const int end = begin + scheduled[i].num_new_tokens;
    const int row0 = b.num_tokens();
    const int num_known = seq.num_tokens();
    for (int pos = begin; pos < end; ++pos) {
      b.token_ids.push_back(pos < num_known ? seq.tokens[pos] : seq.draft_tokens[pos - num_known]);
      b.positions.push_back(pos);
      b.token_seq.push_back(static_cast<int32_t>(i));
      b.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size + pos % block_size);
    }
    b.query_start.push_back(b.num_tokens());
    b.seq_lens.push_back(end);
    const int pages = (end + block_size - 1) / block_size;
    std::copy_n(seq.block_table.begin(), pages, b.page_table.begin() + i * pages_per_seq);

    SeqLogitsRows& rows = plan.rows[i];
    if (seq.wants_prompt_logprobs()) {
      // Position p predicts prompt token p + 1, for p <= num_prompt_tokens - 2.
      const int last = std::min(end, seq.num_prompt_tokens - 1);
      rows.first_prompt_row = static_cast<int>(b.logits_rows.size());
      rows.first_prompt_pos = begin;
      for (int pos = begin; pos < last; ++pos) b.logits_rows.push_back(row0 + (pos - begin));
      rows.num_prompt_rows = std::max(0, last - begin);
    }
    if (end >= num_known) {
      rows.sample_row = static_cast<int>(b.logits_rows.size());
      rows.num_drafts = end - num_known;
      for (int pos = num_known - 1; pos < end; ++pos) b.logits_rows.push_back(row0 + (pos - begin));
    }
  }
}

}  // namespace m3
