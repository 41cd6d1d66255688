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

void AdaptiveVerification::observe(int64_t computed_tokens, int64_t committed_tokens, double seconds) {
  if (computed_tokens <= 0 || !(seconds > 0)) return;
  const double x = static_cast<double>(computed_tokens);
  w_ = w_ * kCostDecay + 1.0;
  x_ = x_ * kCostDecay + x;
  y_ = y_ * kCostDecay + seconds;
  xx_ = xx_ * kCostDecay + x * x;
  xy_ = xy_ * kCostDecay + x * seconds;
  committed_ = committed_ * kRateDecay + static_cast<double>(committed_tokens);
  seconds_ = seconds_ * kRateDecay + seconds;
  ++steps_;
}

double AdaptiveVerification::threshold() const {
  if (steps_ < kMinSteps || seconds_ <= 0) return 0.0;
  const double mean_x = x_ / w_, mean_y = y_ / w_;
  const double var_x = xx_ / w_ - mean_x * mean_x;
  if (var_x < kMinTokenVariance) return 0.0;
  const double cost = (xy_ / w_ - mean_x * mean_y) / var_x;  // seconds per token
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
