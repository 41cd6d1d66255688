#include "engine/request.h"

#include <cmath>

#include "core/error.h"

namespace m3 {

void SamplingParams::validate() const {
  M3_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
           "temperature must be >= 0, got {}", temperature);
  M3_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}",
           top_p);
  M3_CHECK(top_k == -1 || top_k >= 0, "top_k must be -1 (disable), 0 (disable) or at least 1, got {}",
           top_k);
  M3_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}",
           min_p);
  M3_CHECK(std::isfinite(presence_penalty) && presence_penalty >= -2.0f && presence_penalty <= 2.0f,
           "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  M3_CHECK(std::isfinite(frequency_penalty) && frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
           "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  M3_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
           "repetition_penalty must be > 0, got {}", repetition_penalty);
  M3_CHECK(max_tokens >= 0, "max_tokens must be >= 0, got {}", max_tokens);
  M3_CHECK(min_tokens >= 0, "min_tokens must be >= 0, got {}", min_tokens);
  M3_CHECK(min_tokens <= max_tokens, "min_tokens ({}) must be <= max_tokens ({})", min_tokens,
           max_tokens);
  M3_CHECK(logprobs >= -1 && logprobs <= kMaxLogprobs, "logprobs must be in 0..{} (or -1 for none), got {}",
           kMaxLogprobs, logprobs);
  M3_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= kMaxLogprobs,
           "prompt_logprobs must be in 0..{} (or -1 for none), got {}", kMaxLogprobs, prompt_logprobs);
  for (int32_t id : stop_token_ids) {
    M3_CHECK(id >= 0, "stop_token_ids must be non-negative token ids, got {}", id);
  }
  M3_CHECK(logit_bias_ids.size() == logit_bias_values.size(), "logit_bias: {} ids but {} values",
           logit_bias_ids.size(), logit_bias_values.size());
  for (size_t i = 0; i < logit_bias_ids.size(); ++i) {
    M3_CHECK(logit_bias_ids[i] >= 0, "logit_bias holds a negative token id {}", logit_bias_ids[i]);
    M3_CHECK(i == 0 || logit_bias_ids[i - 1] < logit_bias_ids[i], "logit_bias ids must be distinct and sorted");
    M3_CHECK(std::isfinite(logit_bias_values[i]) && std::abs(logit_bias_values[i]) <= 100.0f,
             "logit_bias of token {} must be in [-100, 100], got {}", logit_bias_ids[i], logit_bias_values[i]);
  }
  for (int32_t id : forced_after) M3_CHECK(id >= 0, "forced_after holds a negative token id {}", id);
  for (int32_t id : forced_tokens) M3_CHECK(id >= 0, "forced_tokens holds a negative token id {}", id);
  M3_CHECK(reasoning_budget >= -1, "reasoning_budget must be >= 0 (or -1 for none), got {}", reasoning_budget);
  M3_CHECK(reasoning_budget < 0 || !reasoning_end.empty(), "reasoning_budget needs the reasoning_end token ids");
  for (int32_t id : reasoning_end) M3_CHECK(id >= 0, "reasoning_end holds a negative token id {}", id);
}

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

}  // namespace m3
