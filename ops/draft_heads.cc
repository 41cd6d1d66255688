#include "ops/draft_heads.h"

#include <cmath>

namespace m3 {

float draft_head_dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t n8 = n & ~int64_t(7);
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  float acc = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t i = n8; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

int32_t draft_argmax(const float* logits, int64_t n) {
  int32_t best = 0;
  float best_logit = -INFINITY;
  bool found = false;
  for (int64_t t = 0; t < n; ++t)
    if (!std::isnan(logits[t]) && (!found || logits[t] > best_logit)) {
      best_logit = logits[t];
      best = static_cast<int32_t>(t);
      found = true;
    }
  return best;
}

int markov_block(const MarkovHeadView& h, const float* base, const float* normed, int n, int32_t anchor,
                  const std::function<int32_t(int j, const float* logits)>& pick, int32_t* ids, float* confidence,
                  float* scratch) {
  int32_t prev = anchor;
  for (int j = 0; j < n; ++j) {
    const float* w1 = h.w1 + int64_t(prev) * h.rank;
    const float* row = base + int64_t(j) * h.vocab;
    for (int64_t t = 0; t < h.vocab; ++t) scratch[t] = row[t] + draft_head_dot(h.w2 + t * h.rank, w1, h.rank);
    float c = draft_head_dot(h.confidence_w, normed + int64_t(j) * h.hidden, h.hidden);
    if (h.confidence_with_markov) c += draft_head_dot(h.confidence_w + h.hidden, w1, h.rank);
    confidence[j] = 1.0f / (1.0f + std::exp(-(c + h.confidence_b)));
    const int32_t id = pick(j, scratch);
    if (id < 0) return j;
    ids[j] = prev = id;
  }
  return n;
}

}  // namespace m3
