// Verification of drafted tokens (speculative decoding): from the target's distribution at each
// drafted position and one past the last, and the drafter's tokens (with its distributions when
// it sampled them), which drafts to keep and the one token that follows them.
//
//   standard   Leviathan et al. 2023: draft i is kept with probability min(1, p(x) / q(x)), the
//              first rejected one is replaced by a draw from max(p - q, 0) normalised, and when
//              all are kept a bonus token is drawn from the target one past them.
//   block      Sun et al. 2024 ("block verification"): the drafts are judged as a block, keeping
//              the longest prefix whose running weight passes, not stopping at the first
//              failure; never keeps fewer on average than standard.
//   synthetic  for benchmarks: draft i is kept with a set probability (given the ones before it
//              were), whatever the target says; the text is then not the target's.
// For standard and block the tokens come out distributed exactly as the target's own samples,
// whatever the drafter proposes. Standard with one-hot drafts is computed as "draw from the target
// with the sampler's uniform, keep the draft if the draw equals it" (the same distribution), so a
// greedy or n-gram drafter changes nothing in a seeded request's text, only its speed. A greedy target (temperature 0) is a one-hot p, so both keep
// drafts while they equal its argmax and then emit the argmax. A greedy drafter is a one-hot q.
//
// The distributions are the sampler's (ops/sampling.h sample_distribution: masks, penalties,
// temperature, top-k/top-p/min-p applied), computed by the caller for each position with the
// drafts before it as outputs. Random numbers are counter-based per request (seed, output index):
// the draw of a correction or bonus token at an output index uses the uniform the ordinary
// sampler uses there; acceptance tests use their own streams. So verification is a pure function
// of its inputs: the same in any batch and after preemption.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "ops/sampling.h"

namespace m3 {

enum class RejectionMethod { kStandard, kBlock, kSynthetic };

struct DraftVerification {
  RejectionMethod method = RejectionMethod::kStandard;
  // k + 1 rows: target[i] at draft i's position (given drafts [0, i)), target[k] one past them.
  std::span<const TokenDistribution> target;
  // k drafted ids; a negative id is padding (a slot the drafter did not fill): always rejected.
  std::span<const int32_t> drafts;
  // k rows (a drafter that sampled its tokens), or empty: q is one-hot on each draft.
  std::span<const TokenDistribution> draft;
  // kSynthetic: k rates, rate i = probability of keeping draft i when drafts [0, i) were kept.
  std::span<const float> synthetic_rates;
  uint64_t seed = 0;
  int64_t output_index = 0;  // the request's output index of drafts[0]'s position
};

struct VerifiedTokens {
  int32_t accepted = 0;         // drafts kept
  std::vector<int32_t> tokens;  // the kept drafts, then the correction or bonus token (accepted + 1)
};

// Throws m3::Error when the rows do not match (k + 1 targets, k or 0 draft rows, k rates).
VerifiedTokens verify_drafts(const DraftVerification& v);

// The same decision without the distributions, where it needs none: standard verification of
// one-hot drafts and synthetic verification. `sampled[i]` is the token the ordinary sampler draws
// at output index output_index + i from target row i (so a device sampler can do the drawing);
// returns how many drafts are kept: the step's tokens are drafts [0, kept) and sampled[kept],
// exactly verify_drafts' tokens for the same inputs. Throws m3::Error for kBlock (it needs the
// distributions) and for mismatched sizes.
int32_t accept_sampled(RejectionMethod method, std::span<const int32_t> drafts, std::span<const int32_t> sampled,
                       std::span<const float> synthetic_rates, uint64_t seed, int64_t output_index);

// The uniform a drafter that samples its drafts (probabilistic drafts) uses for the draft at
// `output_index`: a stream of its own, apart from the sampler's (which draws corrections and
// bonus tokens) and the acceptance tests', so that the draft, its test and a correction are
// independent draws.
double draft_uniform(uint64_t seed, int64_t output_index);

// vLLM's synthetic_acceptance_length as rates over k drafts: `length` counts the target's own
// token, so length - 1 drafts are kept on average, spent on the earliest positions (floor(length
// - 1) always, the next with the fractional part): the least-variance schedule, as vLLM and SGLang
// use. Throws m3::Error unless 1 <= length <= k + 1.
std::vector<float> synthetic_rates_for_length(double length, int k);

}  // namespace m3
