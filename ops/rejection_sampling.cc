#include "ops/rejection_sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace m3 {
namespace {

// Streams of the per-request uniforms besides the sampler's own (which draws corrections and
// bonus tokens): whether a draft is kept.
constexpr uint64_t kAcceptStream = 0x5bd1e9955bd1e995ull;
constexpr uint64_t kSyntheticStream = 0x27d4eb2f165667c5ull;
constexpr uint64_t kDraftStream = 0x94d049bb133111ebull;

// The acceptance uniforms of a step are keyed by the step's first output index and the draft's
// place in it, not by the draft's own output index: block verification looks at every draft's
// test, also past the ones it keeps, and the next step starts right after the kept ones, so keys
// by output index alone would hand it uniforms the last step already conditioned on.
constexpr int64_t kMaxDrafts = 256;

double uniform(uint64_t seed, uint64_t stream, int64_t step_output_index, size_t i) {
  return counter_uniform(seed ^ stream, static_cast<uint64_t>(step_output_index * kMaxDrafts) + i);
}

// q(x) of the drafter at draft i: its distribution, or one-hot on the draft.
double draft_prob(const DraftVerification& v, size_t i, int32_t x) {
  if (v.draft.empty()) return x == v.drafts[i] ? 1.0 : 0.0;
  return v.draft[i].prob(x);
}

// Draw from max(rho p - q, 0) normalised, p = target[i], q = the drafter's at i; from p itself
// when nothing is left (p <= q everywhere up to rounding).
int32_t draw_residual(const DraftVerification& v, size_t i, double rho, double u) {
  const TokenDistribution& p = v.target[i];
  TokenDistribution residual;
  residual.total = 0.0;
  for (size_t j = 0; j < p.ids.size(); ++j) {
    const double m = rho * (p.mass[j] / p.total) - draft_prob(v, i, p.ids[j]);
    if (m > 0.0) {
      residual.ids.push_back(p.ids[j]);
      residual.mass.push_back(m);
      residual.total += m;
    }
  }
  return residual.ids.empty() ? p.draw(u) : residual.draw(u);
}

// The mass block verification can still place at the next position: sum over x of
// max(rho p(x) - q(x), 0), p = target[i], q = the drafter's at i.
double residual_mass(const DraftVerification& v, size_t i, double rho) {
  const TokenDistribution& p = v.target[i];
  double r = 0.0;
  for (size_t j = 0; j < p.ids.size(); ++j) r += std::max(rho * (p.mass[j] / p.total) - draft_prob(v, i, p.ids[j]), 0.0);
  return r;
}

double sampler_uniform(const DraftVerification& v, size_t i) {
  return counter_uniform(v.seed, static_cast<uint64_t>(v.output_index + static_cast<int64_t>(i)));
}

VerifiedTokens verify_standard(const DraftVerification& v) {
  VerifiedTokens out;
  const size_t k = v.drafts.size();
  if (v.draft.empty()) {
    // One-hot q: keeping draft x with probability p(x) and otherwise drawing from p without x is
    // drawing from p and keeping x if the draw is x. With the sampler's own uniform, the output is
    // then token for token the output of sequential sampling.
    for (size_t i = 0; i < k; ++i) {
      const int32_t drawn = v.target[i].draw(sampler_uniform(v, i));
      out.tokens.push_back(drawn);
      if (drawn != v.drafts[i]) return out;
      ++out.accepted;
    }
    out.tokens.push_back(v.target[k].draw(sampler_uniform(v, k)));
    return out;
  }
  for (size_t i = 0; i < k; ++i) {
    const int32_t x = v.drafts[i];
    const double p = x >= 0 ? v.target[i].prob(x) : 0.0;
    const double q = x >= 0 ? draft_prob(v, i, x) : 0.0;
    // Keep with probability min(1, p / q): u q < p, u in [0, 1).
    if (!(q > 0.0 && uniform(v.seed, kAcceptStream, v.output_index, i) * q < p)) {
      out.tokens.push_back(draw_residual(v, i, 1.0, sampler_uniform(v, i)));
      return out;
    }
    out.tokens.push_back(x);
    ++out.accepted;
  }
  out.tokens.push_back(v.target[k].draw(sampler_uniform(v, k)));
  return out;
}

VerifiedTokens verify_block(const DraftVerification& v) {
  const size_t k = v.drafts.size();
  // rho[i]: the running weight after drafts [0, i), min(rho[i - 1] p / q, 1); tau: the longest
  // prefix whose test passed (every position is tested, none stops the walk).
  std::vector<double> rho(k + 1, 1.0);
  size_t tau = 0;
  for (size_t i = 1; i <= k; ++i) {
    const int32_t x = v.drafts[i - 1];
    const double p = x >= 0 ? v.target[i - 1].prob(x) : 0.0;
    const double q = x >= 0 ? draft_prob(v, i - 1, x) : 0.0;
    rho[i] = q > 0.0 ? std::min(rho[i - 1] * p / q, 1.0) : 0.0;
    double h = rho[i];
    if (i < k) {
      const double r = residual_mass(v, i, rho[i]);
      const double denominator = r + 1.0 - rho[i];
      h = denominator > 0.0 ? r / denominator : 1.0;
    }
    if (uniform(v.seed, kAcceptStream, v.output_index, i - 1) < h) tau = i;
  }
  VerifiedTokens out;
  out.tokens.assign(v.drafts.begin(), v.drafts.begin() + static_cast<std::ptrdiff_t>(tau));
  out.accepted = static_cast<int32_t>(tau);
  out.tokens.push_back(tau == k ? v.target[k].draw(sampler_uniform(v, k))
                                : draw_residual(v, tau, rho[tau], sampler_uniform(v, tau)));
  return out;
}

VerifiedTokens verify_synthetic(const DraftVerification& v) {
  VerifiedTokens out;
  const size_t k = v.drafts.size();
  for (size_t i = 0; i < k; ++i) {
    const int32_t x = v.drafts[i];
    if (x < 0 || !(uniform(v.seed, kSyntheticStream, v.output_index, i) < v.synthetic_rates[i])) {
      out.tokens.push_back(v.target[i].draw(sampler_uniform(v, i)));
      return out;
    }
    out.tokens.push_back(x);
    ++out.accepted;
  }
  out.tokens.push_back(v.target[k].draw(sampler_uniform(v, k)));
  return out;
}

}  // namespace

double draft_uniform(uint64_t seed, int64_t output_index) {
  return counter_uniform(seed ^ kDraftStream, static_cast<uint64_t>(output_index));
}

int32_t accept_sampled(RejectionMethod method, std::span<const int32_t> drafts, std::span<const int32_t> sampled,
                       std::span<const float> synthetic_rates, uint64_t seed, int64_t output_index) {
  const size_t k = drafts.size();
  M3_CHECK(k < static_cast<size_t>(kMaxDrafts), "verify: {} drafts, at most {}", k, kMaxDrafts - 1);
  M3_CHECK(sampled.size() == k + 1, "verify: {} drafts need {} sampled tokens, got {}", k, k + 1, sampled.size());
  M3_CHECK(method != RejectionMethod::kBlock, "verify: block verification needs the target's distributions");
  M3_CHECK(method != RejectionMethod::kSynthetic || synthetic_rates.size() == k,
           "verify: {} drafts but {} synthetic rates", k, synthetic_rates.size());
  int32_t kept = 0;
  for (size_t i = 0; i < k; ++i) {
    const bool keep = method == RejectionMethod::kStandard
                          ? sampled[i] == drafts[i]
                          : drafts[i] >= 0 && uniform(seed, kSyntheticStream, output_index, i) < synthetic_rates[i];
    if (!keep) break;
    ++kept;
  }
  return kept;
}

VerifiedTokens verify_drafts(const DraftVerification& v) {
  const size_t k = v.drafts.size();
  M3_CHECK(k < static_cast<size_t>(kMaxDrafts), "verify: {} drafts, at most {}", k, kMaxDrafts - 1);
  M3_CHECK(v.target.size() == k + 1, "verify: {} drafts need {} target rows, got {}", k, k + 1, v.target.size());
  M3_CHECK(v.draft.empty() || v.draft.size() == k, "verify: {} drafts but {} drafter rows", k, v.draft.size());
  for (size_t i = 0; i <= k; ++i)
    M3_CHECK(!v.target[i].ids.empty() && v.target[i].total > 0.0, "verify: target row {} is empty", i);
  switch (v.method) {
    case RejectionMethod::kStandard:
      return verify_standard(v);
    case RejectionMethod::kBlock:
      return verify_block(v);
    case RejectionMethod::kSynthetic:
      M3_CHECK(v.synthetic_rates.size() == k, "verify: {} drafts but {} synthetic rates", k, v.synthetic_rates.size());
      return verify_synthetic(v);
  }
  fail("verify: unknown rejection method {}", static_cast<int>(v.method));
}

std::vector<float> synthetic_rates_for_length(double length, int k) {
  M3_CHECK(k >= 1, "synthetic acceptance: {} speculative tokens", k);
  M3_CHECK(std::isfinite(length) && length >= 1.0 && length <= k + 1.0,
           "synthetic_acceptance_length {} is outside [1, {}] for {} speculative tokens (it counts the "
           "target's own token)",
           length, k + 1, k);
  const double kept = length - 1.0;
  std::vector<float> rates(static_cast<size_t>(k), 0.0f);
  const int whole = static_cast<int>(std::floor(kept));
  for (int i = 0; i < whole; ++i) rates[static_cast<size_t>(i)] = 1.0f;
  if (whole < k) rates[static_cast<size_t>(whole)] = static_cast<float>(kept - whole);
  return rates;
}

}  // namespace m3
