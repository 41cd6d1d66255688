// Adaptive verification (--speculative-config enable_adaptive_verification, the DSpark drafter's
// confidence head; vLLM's key): not every draft is worth its row in the next step. The drafter
// estimates c_i, the chance that draft i is kept once drafts [0, i) are; so verifying slot i of a
// request brings S_i = c_0 c_1 ... c_i tokens on average. A step costs about t0 + cost x tokens,
// and the engine commits `rate` tokens a second: a slot whose S_i is below rate x cost gives less
// than its time would give at that rate, so the request's drafts are cut before the first such
// slot.
//
// Exactness: the threshold comes from past steps only, and S_i from the confidences of slots
// [0, i], each computed before its own draft is drawn (c_i reads draft i - 1, never draft i). So
// whether slot i is verified depends on drafts [0, i), not on draft i, and verification keeps the
// target's distribution (a cut that looked at draft i itself, as a threshold chosen from this
// step's drafts would, could not promise that).
//
// The cost of a row is fitted over recent steps (weighted least squares of a step's seconds on its
// decode tokens and its prompt tokens; the decode slope is the cost of a row). While every step has the same number of tokens that line is unknown, so one proposal
// in kProbeEvery verifies only the first half of each request's drafts, whatever their confidence
// (a cut that depends on nothing the drafts hold): the steps then differ in size. Until the fit is
// known every draft is verified.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace m3 {

class AdaptiveVerification {
 public:
  static constexpr uint64_t kProbeEvery = 16;

  // A finished step: the tokens it computed for decoding requests (their last tokens and drafts)
  // and for prompts, the tokens it committed (emitted), its wall seconds (the draft step after it
  // included). A prompt's tokens cost another price than a verification's rows, so the fit has a
  // slope for each.
  void observe(int64_t decode_tokens, int64_t prompt_tokens, int64_t committed_tokens, double seconds);
  // The threshold for S_i: rate x cost, in [0, 1]; 0 while the cost of a token is unknown.
  double threshold() const;
  // How many of a request's `num_drafts` drafts to verify (a prefix), given the drafter's
  // confidence of each; every one when the drafter gave none. Call for each request of a
  // proposal, after begin_proposal().
  size_t keep(size_t num_drafts, std::span<const float> confidence) const;
  // Before each proposal's cuts: decides whether it is a probe.
  void begin_proposal();
  bool probing() const { return probing_; }

 private:
  // Exponentially weighted sums of the steps (weight 1 for the newest): decode tokens d, prompt
  // tokens p, seconds y.
  double w_ = 0, d_ = 0, p_ = 0, y_ = 0, dd_ = 0, pp_ = 0, dp_ = 0, dy_ = 0, py_ = 0;
  double committed_ = 0, seconds_ = 0;  // for the rate
  uint64_t steps_ = 0, proposals_ = 0;
  bool probing_ = false;
};

}  // namespace m3
