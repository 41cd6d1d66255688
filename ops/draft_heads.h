// The DSpark drafter's two heads over a block's base logits (docs/speculative-decoding.md "The
// DSpark drafter"): the ONE definition of their semantics. Backend::markov_drafts (greedy, on
// the device) follows it, and the drafter runs it on the host for probabilistic drafts.
//
// A block of n rows (the anchor's query and n - 1 noise queries), base logits b_j [vocab] and
// final-normed hidden states x_j [hidden]. With prev_0 = the anchor and prev_j = draft j - 1:
//   markov_j[t] = sum_i w2[t, i] w1[prev_j, i]          (rank r; fp32, dot() order below)
//   logits_j   = b_j + markov_j
//   draft_j    = pick(j, logits_j)                        (greedy: argmax, the lowest id on a tie;
//                                                          NaN never wins)
//   confidence_j = sigmoid(c_b + sum_e c_w[e] x_j[e] (+ sum_i c_w[hidden + i] w1[prev_j, i]))
// the last sum only when the head was trained with the Markov state (confidence_with_markov).
#pragma once
#include <cstdint>
#include <functional>

namespace m3 {

// Host views of the heads' weights (fp32, row-major).
struct MarkovHeadView {
  const float* w1 = nullptr;  // [vocab, rank]
  const float* w2 = nullptr;  // [vocab, rank]
  int64_t vocab = 0;
  int rank = 0;
  const float* confidence_w = nullptr;  // [hidden + (with_markov ? rank : 0)]
  float confidence_b = 0.0f;
  bool confidence_with_markov = true;
  int64_t hidden = 0;
};

// Sum of a[i] b[i] in eight interleaved fp32 lanes, reduced ((0+4)+(2+6))+((1+5)+(3+7)), then the
// tail: the order every backend's Markov and confidence sums follow.
float draft_head_dot(const float* a, const float* b, int64_t n);

// Greedy: the argmax of a row (the lowest id on a tie; NaN never wins; 0 when every value is NaN).
int32_t draft_argmax(const float* logits, int64_t n);

// One block: base [n, vocab] and normed [n, hidden] rows, in order; ids[j] = pick(j, logits_j)
// (logits_j in `scratch`, [vocab]), confidence[j] as above. A pick below 0 ends the block there
// (a constraint that allows no further token); returns the drafts picked.
int markov_block(const MarkovHeadView& head, const float* base, const float* normed, int n, int32_t anchor,
                  const std::function<int32_t(int j, const float* logits)>& pick, int32_t* ids, float* confidence,
                  float* scratch);

}  // namespace m3
