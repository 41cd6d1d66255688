#include "engine/drafter.h"

#include <algorithm>

#include "core/error.h"

namespace m3 {

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  M3_CHECK(min_n >= 1 && min_n <= max_n, "ngram drafter: n-gram lengths {} to {}", min_n, max_n);
}

void NgramDrafter::propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) {
  drafts.assign(requests.size(), Draft());
  for (size_t i = 0; i < requests.size(); ++i) propose_one(requests[i].tokens, requests[i].max_drafts, drafts[i].tokens);
}

void NgramDrafter::propose_one(std::span<const int32_t> tokens, int max_drafts, std::vector<int32_t>& out) const {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0) return;
  // One backward scan: at each earlier end position e (the match is tokens [e - n, e)), the
  // length of the common suffix with the text's end, capped at max_n. The latest end with the
  // longest length (>= min_n) wins.
  int64_t best_end = -1;
  int best_n = min_n_ - 1;
  const int32_t last = tokens[size - 1];
  for (int64_t e = size - 1; e >= min_n_ && best_n < max_n_; --e) {
    if (tokens[e - 1] != last) continue;
    int n = 1;
    while (n < max_n_ && n < e && tokens[e - 1 - n] == tokens[size - 1 - n]) ++n;
    if (n > best_n) {
      best_n = n;
      best_end = e;
    }
  }
  if (best_end < 0) return;
  const int64_t end = std::min<int64_t>(size, best_end + max_drafts);
  out.insert(out.end(), tokens.begin() + best_end, tokens.begin() + end);
}

std::unique_ptr<Drafter> make_model_free_drafter(const SpeculativeConfig& config) {
  if (config.method == "ngram") return std::make_unique<NgramDrafter>(config.prompt_lookup_min, config.prompt_lookup_max);
  fail("--speculative-config: method {} drafts with a model, which the model runner provides, and this one has "
       "none ({})",
       config.method, config.summary());
}

}  // namespace m3
