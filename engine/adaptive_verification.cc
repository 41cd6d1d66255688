#include "engine/adaptive_verification.h"

#include <algorithm>
#include <cmath>

namespace m3 {
namespace {

constexpr double kCostDecay = 0.98;  // about the last 50 steps
constexpr double kRateDecay = 0.9;   // about the last 10
constexpr uint64_t kMinSteps = 8;
constexpr double kMinTokenVariance = 0.25;  // tokens^2: the steps' sizes must differ to fit a slope

}  // namespace

void AdaptiveVerification::observe(int64_t decode_tokens, int64_t prompt_tokens, int64_t committed_tokens,
                                   double seconds) {
  if (decode_tokens + prompt_tokens <= 0 || !(seconds > 0)) return;
  committed_ = committed_ * kRateDecay + static_cast<double>(committed_tokens);
  seconds_ = seconds_ * kRateDecay + seconds;
  const double d = static_cast<double>(decode_tokens), p = static_cast<double>(prompt_tokens);
  auto decay = [](double& sum, double x) { sum = sum * kCostDecay + x; };
  decay(w_, 1.0);
  decay(d_, d);
  decay(p_, p);
  decay(y_, seconds);
  decay(dd_, d * d);
  decay(pp_, p * p);
  decay(dp_, d * p);
  decay(dy_, d * seconds);
  decay(py_, p * seconds);
  ++steps_;
}

double AdaptiveVerification::threshold() const {
  if (steps_ < kMinSteps || seconds_ <= 0) return 0.0;
  // Centred (co)variances of the weighted steps.
  const double md = d_ / w_, mp = p_ / w_, my = y_ / w_;
  const double sdd = dd_ / w_ - md * md, spp = pp_ / w_ - mp * mp, sdp = dp_ / w_ - md * mp;
  const double sdy = dy_ / w_ - md * my, spy = py_ / w_ - mp * my;
  if (sdd < kMinTokenVariance) return 0.0;
  double cost = sdy / sdd;  // seconds per decode token, prompts not varying
  const double det = sdd * spp - sdp * sdp;
  if (spp >= kMinTokenVariance && det > 1e-6 * sdd * spp) cost = (sdy * spp - spy * sdp) / det;
  if (!(cost > 0)) return 0.0;
  const double rate = committed_ / seconds_;  // tokens per second
  return std::clamp(rate * cost, 0.0, 1.0);
}

void AdaptiveVerification::begin_proposal() { probing_ = ++proposals_ % kProbeEvery == 0; }

size_t AdaptiveVerification::keep(size_t num_drafts, std::span<const float> confidence) const {
  if (confidence.size() < num_drafts) return num_drafts;  // no estimate to cut by
  if (probing_) return (num_drafts + 1) / 2;
  const double tau = threshold();
  double s = 1.0;
  for (size_t i = 0; i < num_drafts; ++i) {
    s *= static_cast<double>(confidence[i]);
    if (!(s >= tau)) return i;  // a NaN confidence cuts too
  }
  return num_drafts;
}

}  // namespace m3
