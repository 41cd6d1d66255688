// What the completion and chat routes share: body parsing, model-name and length checks, the
// engine requests of a choice set and per-choice bookkeeping (text pipeline, token counts, finish
// reason). The response itself is driven by server/response_session.h.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/request.h"
#include "server/choice_output.h"
#include "server/generation_job.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_context.h"

namespace m3::server {

struct HttpRequest;

// The body as JSON: strict UTF-8 (the offset of a bad byte is reported), valid JSON, nesting at
// most kMaxJsonDepth deep and numbers a double can hold, else 400 (server/json_parse.h).
Json parse_json_body(const HttpRequest& req);
// 404 unless `requested` is empty or one of --served-model-name.
void check_model_name(const ServerContext& context, const std::string& requested);
// Token ids within the vocabulary and a non-empty prompt, else 400 naming `field`.
void check_prompt_ids(const std::vector<int32_t>& ids, int vocab_size, std::string_view field);
// The output budget: the client's max_tokens, else generation_config's max_new_tokens, else the
// room left in the context. 400 (vLLM's messages) when the prompt or prompt + max_tokens does
// not fit max_model_len, naming `prompt_field` or `max_tokens_field`.
int resolve_max_tokens(const CommonRequest& request, const ModelContext& model, int prompt_tokens,
                       std::string_view prompt_field,
                       std::string_view max_tokens_field = "max_tokens");

// The query parameters of a request target ("/p?a=1&b=x%20y"), percent-decoded ('+' is a space),
// in order. A malformed escape is a 400 naming the parameter.
std::vector<std::pair<std::string, std::string>> query_parameters(std::string_view target);
// Path segments as the client meant them ("a%2Fb" -> "a/b"; '+' stays '+'). A malformed escape is
// a 400 naming `what`.
std::string path_segments_decoded(std::string_view segments, std::string_view what);

// Engine requests for n samples of one prompt; a seeded request's sample j uses seed + j (vLLM).
std::vector<EngineRequest> make_engine_requests(const std::string& id_prefix,
                                                const std::vector<int32_t>& prompt_ids,
                                                const SamplingParams& sampling, int n,
                                                const ModelContext& model);

// One choice of a response, as the routes track it.
struct ChoiceState {
  ChoiceState(const text::Tokenizer& tokenizer, ChoiceTextOptions options)
      : text(tokenizer, std::move(options)) {}

  ChoiceOutput text;
  int prompt_index = 0;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
  std::vector<int32_t> output_ids;
  std::vector<PositionLogprobs> logprobs;  // not yet sent (streaming) / all (non-streaming)
  std::optional<std::vector<PositionLogprobs>> prompt_logprobs;
  bool ended = false;            // the choice's output is over (finish reason known)
  bool engine_finished = false;  // the engine's final output arrived
  ChoiceEnd end;
  std::string error;  // finish reason "error"
};

// Applies one engine output to its choice and returns the text that became final. Decides the
// finish reason: stop (eos, stop token id -> stop_reason = id, or stop string -> stop_reason =
// the string, in which case the engine request is aborted; also when a tool call past the
// choice's max_tool_calls began), length, tool_calls (stop with a tool call), abort (client gone
// / shutdown), error.
ChoiceDelta apply_output(ChoiceState& choice, const RequestOutput& output, int choice_index,
                         GenerationJob& job, const std::vector<int32_t>& stop_token_ids);

// Counts a finished choice in vllm:request_success_total.
void count_finished(ServerMetrics& metrics, const ChoiceState& choice);
// The client went away: every choice still open counts as aborted.
void count_abandoned(ServerMetrics& metrics,
                     const std::vector<std::unique_ptr<ChoiceState>>& choices);

// Usage over all choices: prompt tokens once per prompt, completion tokens summed.
// The usage of all choices (each prompt counted once); cached_tokens only with
// prompt_tokens_details (--enable-prompt-tokens-details).
nlohmann::json total_usage(const std::vector<std::unique_ptr<ChoiceState>>& choices, bool prompt_tokens_details);

}  // namespace m3::server
