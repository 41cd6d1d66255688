// The plain messages between the server and the engine: what a request asks for
// (EngineRequest + SamplingParams) and what the engine reports back (RequestOutput).
//
// Semantics follow vLLM's SamplingParams / RequestOutput so that an OpenAI request maps field by
// field. Stop strings are the server's job (it detokenizes and calls EngineCore::abort when one
// matches); stop token ids and eos are the engine's.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/token_constraint.h"

namespace m3 {

// Limits shared by validation and the server's own checks.
inline constexpr int kMaxLogprobs = 20;  // OpenAI's top_logprobs limit, also vLLM's default

struct SamplingParams {
  // 0 selects greedy decoding (argmax after penalties); values below 1e-5 count as 0 (vLLM).
  float temperature = 1.0f;
  float top_p = 1.0f;  // (0, 1]; 1 disables
  int top_k = 0;       // 0 or -1 disables; otherwise >= 1
  float min_p = 0.0f;  // [0, 1]; 0 disables. Keeps tokens with prob >= min_p * max prob.
  // Penalties as vLLM applies them to the logits before temperature:
  //   repetition (> 0, 1 disables): over prompt + output tokens, logit > 0 ? logit / r : logit * r;
  //   presence and frequency ([-2, 2]): over output tokens only,
  //   logit -= presence * (count > 0) + frequency * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // OpenAI's logit_bias: each listed id's logit gets its value added, after the masks and before
  // the penalties (vLLM's order). Distinct ids in the vocabulary, values in [-100, 100].
  std::vector<int32_t> logit_bias_ids;
  std::vector<float> logit_bias_values;
  // Seeded requests sample identically whatever else is in the batch, across runs and after
  // preemption (the random draw of output token i depends only on (seed, i)). Unseeded requests
  // get a seed drawn at add_request from the engine's generator (EngineConfig::seed).
  std::optional<uint64_t> seed;
  // Output tokens at most. >= 0 (0 = run the prompt only, e.g. for prompt_logprobs; finishes
  // with reason length). The server fills it (e.g. max_model_len - prompt length) when the
  // client gives none. prompt + max_tokens must fit max_model_len (checked by add_request).
  int max_tokens = 16;
  int min_tokens = 0;  // eos and stop_token_ids are masked until this many tokens exist; <= max_tokens
  std::vector<int32_t> stop_token_ids;  // finish with reason stop when sampled (also reported)
  bool ignore_eos = false;              // eos ids do not stop (stop_token_ids still do)
  // Logprobs are log_softmax of the RAW logits (before penalties/temperature), as vLLM's default.
  int logprobs = -1;         // -1: none; k in 0..20: the sampled token's logprob + the top k
  int prompt_logprobs = -1;  // -1: none; k in 0..20: per prompt token, its logprob + the top k
  // A forced continuation (the server's tool_choice "required" or named function): once the
  // output contains `forced_after` (empty: from the first output token), the next output tokens
  // are `forced_tokens`, whatever the logits say (their logprobs are still reported). Decided by
  // the output ids alone, so it holds across batching and preemption. Only the first occurrence
  // of `forced_after` counts.
  std::vector<int32_t> forced_after;
  std::vector<int32_t> forced_tokens;
  // A cap on the reasoning (the server's Anthropic thinking.budget_tokens), for an output that
  // starts inside reasoning: when the output reaches `reasoning_budget` tokens and has not yet
  // contained `reasoning_end` (the reasoning closer's ids), the next tokens are `reasoning_end`,
  // so the answer begins. It may complete `forced_after` (a tool call forced after reasoning).
  // -1: no cap.
  int reasoning_budget = -1;
  std::vector<int32_t> reasoning_end;
  // Structured outputs (JSON schema, regex, choice, grammar, tool calls): each sequence starts its
  // own TokenConstraint from the spec; before every sampled token the constraint's allowed-token
  // mask applies (computed on the host while the forward pass runs), every generated token
  // advances it, and the sequence ends (reason stop) once the constraint is complete. Null: none.
  std::shared_ptr<const TokenConstraintSpec> constraint;

  bool greedy() const { return temperature < 1e-5f; }
  // Throws m3::Error naming the first invalid field, e.g. "top_p must be in (0, 1], got 1.5".
  void validate() const;
};

struct EngineRequest {
  std::string id;  // unique among requests in flight (add_request rejects a duplicate)
  std::vector<int32_t> prompt_token_ids;  // non-empty, every id < vocab size
  SamplingParams sampling;
  std::vector<int32_t> eos_token_ids;  // from the tokenizer / generation_config; may be empty
};

enum class FinishReason : uint8_t {
  kNone,    // still running
  kStop,    // eos or a stop token id was sampled (stop_token_id says which)
  kLength,  // max_tokens reached, or the context (max_model_len) is full
  kAbort,   // EngineCore::abort, or shutdown without drain
  kError,   // the step failed (error says why); the engine keeps serving the others
};
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error"; "" for kNone

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// One position's logprob information.
struct PositionLogprobs {
  int32_t token_id = 0;  // the sampled (or, for prompt logprobs, the actual) token
  float logprob = 0.0f;
  int32_t rank = 0;  // 1 + number of tokens with a strictly larger logprob (vLLM's rank)
  std::vector<TokenLogprob> top;  // the k most likely tokens, descending logprob, ties by lower id
};

// Per-request timings, on the final output only (seconds; for vLLM's request histograms).
// The phases are vLLM's (vllm:request_{queue,prefill,decode,inference}_time_seconds): queued ->
// first scheduled -> first token -> last token. A request that produced no token has no
// prefill, decode or inference time (0).
struct RequestTimings {
  double queue_s = 0.0;      // add_request -> first scheduled
  double ttft_s = 0.0;       // add_request -> first output token (0 if none)
  double e2e_s = 0.0;        // add_request -> finished
  double prefill_s = 0.0;    // first scheduled -> first output token
  double decode_s = 0.0;     // first output token -> last output token
  double inference_s = 0.0;  // first scheduled -> last output token (prefill + decode)
};

// What the sink receives. The engine calls the sink from its own thread after each step that
// produced something for the request: new tokens, or the final state. Exactly one call has
// finished = true, and it is the last call. A step's output for a request is delivered before
// the next step runs.
struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;  // tokens produced by this step (usually 1; 0 in a final
                                       // output for abort/error/max_tokens = 0)
  std::vector<PositionLogprobs> logprobs;  // parallel to new_token_ids when sampling.logprobs >= 0
  // Delivered once, with the first output, when sampling.prompt_logprobs >= 0: entry i describes
  // prompt token i + 1 (the first prompt token has none; vLLM reports it as null).
  std::optional<std::vector<PositionLogprobs>> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token_id;  // the eos / stop token that finished it (kStop only);
                                         // it is also the last entry of new_token_ids
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache (first schedule)
  std::string error;                 // kError only
  std::optional<RequestTimings> timings;  // final output only
};

}  // namespace m3
