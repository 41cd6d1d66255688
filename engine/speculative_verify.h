// The host side of one request's speculative verification: the target's logits rows for its k
// drafts and one past them become the distributions the ordinary sampler would draw from at those
// output indices, each row with the drafts before it counted as outputs (penalties, min_tokens'
// masking), and ops/rejection_sampling decides which drafts to keep and the token after them.
// With every draft kept or none, the tokens are those sequential sampling could have given; the
// distribution of the output is the target's (ops/rejection_sampling.h).
//
// The caller's to handle: structured outputs (SpeculativeStep::allowed, the masks after each
// draft) and forced continuations (SamplingParams::forced_tokens, the reasoning budget), which
// replace sampling rather than shape it: the engine never puts a verification row on one.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sample_rows.h"
#include "ops/rejection_sampling.h"

namespace m3 {

struct SpeculativeStep {
  const SamplingState* state = nullptr;  // the request at the output index of drafts[0]
  std::span<const float> logits;         // (k + 1) x vocab: row i follows drafts [0, i)
  int32_t vocab = 0;
  std::span<const int32_t> drafts;                // k (a negative id: padding)
  std::span<const TokenDistribution> draft_rows;  // k (probabilistic drafts) or empty (greedy)
  RejectionMethod method = RejectionMethod::kStandard;
  std::span<const float> synthetic_rates;  // k, kSynthetic only
  // Structured outputs: k + 1 allowed masks of allowed_words words each (row i's: the constraint
  // after drafts [0, i)), or empty.
  std::span<const uint32_t> allowed;
  int32_t allowed_words = 0;
};

class SpeculativeVerifier {
 public:
  // Throws m3::Error when the rows do not match the drafts.
  VerifiedTokens verify(const SpeculativeStep& step);

 private:
  SampleBatch batch_;
  SampleWorkspace ws_;
  std::vector<TokenDistribution> target_;
};

}  // namespace m3
