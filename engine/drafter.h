// What proposes the drafts of the speculative step (--speculative-config): for each running
// request, up to k tokens that may follow its text. The target verifies them in its next step
// (engine/engine_loop.h), so a drafter decides only the speed, never the text: a bad guess costs a
// wasted row of that step.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/speculative_config.h"
#include "ops/sampling.h"
#include "ops/token_constraint.h"

namespace m3 {

struct DraftRequest {
  std::span<const int32_t> tokens;  // prompt and output so far (the last one not yet computed)
  int max_drafts = 0;               // at most this many (>= 1)
  // The request's KV blocks: tokens [0, tokens.size() - 1) are computed there (a drafter with a
  // cache beside the target's, DSpark, reads its context at the same slots).
  std::span<const int32_t> block_table;
  // The request's sampling, for a drafter that samples its drafts (probabilistic drafts): its
  // parameters, seed and the output index of the first draft (ops/rejection_sampling.h
  // draft_uniform gives the draws).
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;
  int output_index = 0;
  // The request's structured-output constraint as it stands after `tokens` (null: none), and how
  // many tokens the request may still produce. A drafter that follows constraints
  // (Drafter::follows_constraints) drafts under its masks and leaves it as it found it.
  TokenConstraint* constraint = nullptr;
  int remaining_tokens = 0;
};

// A request's drafts, and the distribution each was drawn from when the drafter sampled them
// (empty: one-hot drafts, verified by the target's own draws).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> rows;
  // The drafter's estimate that draft i is kept once drafts [0, i) are (DSpark's confidence head;
  // empty: none). It may read drafts [0, i), never draft i itself: adaptive verification cuts by
  // it (engine/adaptive_verification.h), and a cut that depended on the draft it cuts would bias
  // the verification of sampled requests.
  std::vector<float> confidence;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // drafts[i]: up to requests[i].max_drafts ids for request i; fewer or none when it has no guess.
  virtual void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) = 0;
  // Whether drafts of a constrained request are drawn under the constraint's masks (draft j under
  // the mask after drafts [0, j), ops/token_constraint.h DraftConstraintWalk: greedy drafts the
  // best allowed token, probabilistic ones from the masked distribution), so none is ever refused.
  // The engine cuts the drafts of other drafters where the constraint refuses one, which changes
  // the distribution of probabilistic drafts: those requests then do not draft.
  virtual bool follows_constraints() const { return false; }
};

// Prompt lookup (vLLM's "ngram"): the text's last n tokens, n from prompt_lookup_max down to
// prompt_lookup_min, are looked for earlier in the text; at the latest earlier occurrence of the
// longest n that has one, the tokens that followed it are the drafts. Costs one backward scan of
// the text per request and step (no index); no model.
class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n, int max_n);
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override;
  // One request's drafts (appended to `out`).
  void propose_one(std::span<const int32_t> tokens, int max_drafts, std::vector<int32_t>& out) const;

 private:
  int min_n_, max_n_;
};

// The drafter of a configuration that needs no model (ngram). Throws m3::Error for the others:
// their drafter comes with the runner (ModelRunner::drafter()).
std::unique_ptr<Drafter> make_model_free_drafter(const SpeculativeConfig& config);

}  // namespace m3
