// Pieces of OpenAI response bodies shared by the completion and chat routes, in the shapes the
// openai clients and vLLM use: ids, usage, logprobs, SSE framing.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "text/tokenizer.h"

namespace m3::server {

// "<prefix>" + 32 random hex digits ("chatcmpl-...", "cmpl-...").
std::string make_response_id(std::string_view prefix);
int64_t unix_time_seconds();

// Compact JSON; invalid UTF-8 (which the detokenizer never produces, but a token string of a
// partial character might) becomes U+FFFD instead of an exception.
std::string dump_json(const nlohmann::json& value);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}}; prompt_tokens_details is null without cached_tokens (as vLLM without
// --enable-prompt-tokens-details).
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens, std::optional<int64_t> cached_tokens);

// finish_reason / stop_reason of a choice as vLLM reports them.
struct ChoiceEnd {
  std::string finish_reason;             // stop | length | tool_calls | abort | error
  nlohmann::json stop_reason = nullptr;  // the stop string, the stop token id, or null (eos)
};

// Token text for logprobs: the token decoded on its own, special tokens included.
class TokenStrings {
 public:
  explicit TokenStrings(const text::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string text(int32_t id) const;

 private:
  const text::Tokenizer& tokenizer_;
};

// JSON cannot hold -inf; vLLM reports such logprobs as -9999.0.
double json_logprob(float logprob);

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]} entries.
nlohmann::json chat_logprob_entries(const std::vector<PositionLogprobs>& positions,
                                    const TokenStrings& strings, int top_k);

// Completions: parallel lists, built up token by token.
class CompletionLogprobs {
 public:
  CompletionLogprobs(const TokenStrings& strings, int top_k) : strings_(strings), top_k_(top_k) {}
  // A token with no logprob information (the first prompt token under echo).
  void add_unscored(int32_t token_id);
  void add(const PositionLogprobs& position);
  // `text_offset_base`: offset of the first token added since the last take(); offsets of later
  // tokens follow from the token strings. Returns the JSON object and starts a new one.
  nlohmann::json take(int64_t text_offset_base);
  int64_t text_length() const { return text_length_; }

 private:
  const TokenStrings& strings_;
  int top_k_;
  nlohmann::json tokens_ = nlohmann::json::array();
  nlohmann::json token_logprobs_ = nlohmann::json::array();
  nlohmann::json top_logprobs_ = nlohmann::json::array();
  std::vector<int64_t> lengths_;
  int64_t text_length_ = 0;  // characters of every token string added so far
};

// vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...].
nlohmann::json prompt_logprobs_json(const std::vector<PositionLogprobs>& positions,
                                    const TokenStrings& strings);

}  // namespace m3::server
