// The OpenAI request bodies m3serve accepts, parsed and validated field by field. Everything a
// client can get wrong here becomes a 400 ApiError naming the field; checks that need the model
// (token ids in range, prompt length vs max_model_len) happen later, in the pipelines.
//
// Unknown fields are ignored, as vLLM does. Known fields m3serve cannot honour (logit_bias,
// suffix, ...) are rejected instead of being silently ignored.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "grammar/structured_output.h"
#include "server/json_fields.h"

namespace m3::server {

// Sampling values the client set. Unset ones fall back to the model's generation_config.json
// defaults (--generation-config), then to the engine's.
struct SamplingRequest {
  std::optional<double> temperature, top_p, min_p;
  std::optional<double> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;
  // logit_bias {"<token id>": bias}: sorted by id; the ids are checked against the vocabulary
  // where it is known (make_sampling_params).
  std::vector<std::pair<int32_t, double>> logit_bias;
};

// Fields shared by /v1/completions and /v1/chat/completions.
struct CommonRequest {
  std::string model;  // empty: the client gave none (the served model is used)
  int n = 1;
  std::optional<int64_t> max_tokens;  // max_tokens, or max_completion_tokens for chat
  int64_t min_tokens = 0;
  SamplingRequest sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats (vLLM)
  int logprobs = -1;                    // top logprobs per output token; -1 = none
  int prompt_logprobs = -1;             // vLLM extension; -1 = none
  bool return_token_ids = false;        // vLLM extension: token_ids / prompt_token_ids in choices
  // response_format / structured_outputs / guided_* (server/structured_output_request.h).
  std::optional<grammar::StructuredOutputSpec> structured;
};

// One prompt of /v1/completions: text, or token ids given directly.
struct PromptInput {
  bool is_token_ids = false;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct CompletionRequest {
  CommonRequest common;
  std::vector<PromptInput> prompts;  // a batch of prompts: choices are prompt-major
  bool echo = false;
  bool add_special_tokens = true;
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatRequest {
  CommonRequest common;
  // Normalized for the chat template: content parts joined to strings, tool-call arguments parsed
  // into objects, `reasoning` copied to `reasoning_content`.
  Json messages = Json::array();
  Json tools;  // array of {"type": "function", "function": {...}}, or null
  ToolChoice tool_choice = ToolChoice::kNone;
  bool tool_choice_given = false;
  std::string tool_choice_name;          // kNamed
  bool parallel_tool_calls = true;       // false: at most one call (tool_choice required: exactly one)
  std::string response_format = "text";  // text | json_object | json_schema
  Json response_schema;                  // json_schema.schema, or null
  std::optional<std::string> reasoning_effort;
  Json chat_template_kwargs = Json::object();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;  // the template writes the special tokens itself (vLLM default)
  int top_logprobs = 0;             // with logprobs: true
};

// What the request parsers need to know about the server.
struct RequestLimits {
  int max_n = 128;
  int max_logprobs = 20;
  int max_stop_strings = 64;
};

CompletionRequest parse_completion_request(const Json& body, const RequestLimits& limits);
ChatRequest parse_chat_request(const Json& body, const RequestLimits& limits);

// Pieces shared with the Responses request parser (server/responses_request):
// the sampling fields (temperature, top_p, top_k, min_p, penalties, seed), range-checked;
SamplingRequest parse_sampling(const Json& body);
// a content-part array (text / input_text / output_text / refusal parts) joined into one string,
// any other part type a 400 naming `path`[i].
std::string join_text_parts(const Json& parts, std::string_view path);

}  // namespace m3::server
