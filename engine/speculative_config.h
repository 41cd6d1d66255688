// --speculative-config (vLLM's JSON, as the seed's command lines give it) as a checked value:
// every key m3serve knows, each value checked and its meaning fixed here, anything else a clear
// error that names the key. What runs the configuration is not here: the drafter and its runner.
//
//   method                   "dspark" (the DSpark drafter model), or "ngram" (prompt lookup: the
//                            tokens that followed the latest earlier occurrence of the text's last
//                            n tokens; no model; "[ngram]" is read as "ngram")
//   prompt_lookup_min / _max ngram only: the n-gram lengths tried, longest first (vLLM's
//                            defaults: 5 and 5; one given sets both)
//   model                    dspark: the drafter's directory; default: dspark/ inside the target's
//   num_speculative_tokens   k >= 1 drafts a step
//   draft_sample_method      "greedy" (default: argmax drafts, q one-hot in verification) or
//                            "probabilistic" (drafts sampled, q kept for verification)
//   rejection_sample_method  "standard" (default), "block" or "synthetic" (ops/rejection_sampling.h)
//   synthetic_acceptance_length / synthetic_acceptance_rates
//                            synthetic only, exactly one of them: the mean tokens a step counting
//                            the target's own, or k conditional rates in [0, 1]
//   kv_cache_dtype           the DSpark drafter's cache: float32 (default, "auto"), bfloat16, fp8
//   attention_backend        accepted and logged: m3serve picks its own kernels
//   enable_adaptive_verification
//                            dspark only: verify a request's drafts only while the drafter's
//                            confidence says they pay for their rows (engine/adaptive_verification.h)
//   disable_by_batch_size    no drafting in a step while more requests than this are running
//                            (vLLM's key; where verifying k + 1 tokens a request costs more than
//                            the kept drafts bring, as on a busy CPU)
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ops/kv_layout.h"
#include "ops/rejection_sampling.h"

namespace m3 {

struct SpeculativeConfig {
  std::string method;  // "dspark" or "ngram"
  std::string model;   // empty: <target>/dspark
  int num_speculative_tokens = 0;
  bool probabilistic_drafts = false;
  RejectionMethod rejection = RejectionMethod::kStandard;
  std::vector<float> synthetic_rates;  // k rates when rejection is kSynthetic
  std::optional<KvDType> kv_cache_dtype;  // the DSpark drafter's cache; empty: float32
  std::string attention_backend;       // as given; not used
  int prompt_lookup_min = 0, prompt_lookup_max = 0;  // ngram only
  std::optional<int> disable_by_batch_size;
  bool adaptive_verification = false;

  // One line for logs and errors: "dspark, k=7, probabilistic drafts, standard verification, fp8_e4m3 drafter cache".
  std::string summary() const;
};

// Parses and checks the JSON text of --speculative-config. Throws m3::Error naming the key at fault.
SpeculativeConfig parse_speculative_config(const std::string& json_text);

}  // namespace m3
