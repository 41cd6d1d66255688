#include "engine/speculative_verify.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace m3 {

VerifiedTokens SpeculativeVerifier::verify(const SpeculativeStep& step) {
  M3_CHECK(step.state && step.state->params, "speculative verify: no sampling state");
  const size_t k = step.drafts.size();
  M3_CHECK(step.vocab > 0 && step.logits.size() == (k + 1) * static_cast<size_t>(step.vocab),
           "speculative verify: {} drafts need {} logits rows of {}, got {} values", k, k + 1, step.vocab,
           step.logits.size());
  // Row i sees the drafts before it as outputs: their counts (penalties) and its own output index
  // (min_tokens' masking, the draw's uniform).
  std::unordered_map<int32_t, int32_t> counts;
  if (step.state->output_counts) counts = *step.state->output_counts;
  target_.resize(k + 1);
  for (size_t i = 0; i <= k; ++i) {
    if (i > 0 && step.drafts[i - 1] >= 0) ++counts[step.drafts[i - 1]];
    SamplingState row_state = *step.state;
    row_state.output_index = step.state->output_index + static_cast<int>(i);
    row_state.output_counts = &counts;
    batch_.clear();
    add_sample_row(batch_, 0, row_state);
    if (!step.allowed.empty()) {
      const auto words = static_cast<size_t>(step.allowed_words);
      M3_CHECK(step.allowed.size() == (k + 1) * words, "speculative verify: {} allowed words for {} rows of {}",
               step.allowed.size(), k + 1, words);
      batch_.rows[0].allowed_row = batch_.add_allowed_row(step.allowed_words);
      std::copy_n(step.allowed.begin() + i * words, words, batch_.allowed.begin());
    }
    sample_distribution(step.logits.data() + i * static_cast<size_t>(step.vocab), step.vocab, batch_.rows[0],
                        batch_, ws_, target_[i]);
  }
  DraftVerification v;
  v.method = step.method;
  v.target = target_;
  v.drafts = step.drafts;
  v.draft = step.draft_rows;
  v.synthetic_rates = step.synthetic_rates;
  v.seed = step.state->seed;
  v.output_index = step.state->output_index;
  return verify_drafts(v);
}

}  // namespace m3
