#include "server/route_common.h"

#include <algorithm>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/json_parse.h"
#include "server/utf8.h"

namespace m3::server {

Json parse_json_body(const HttpRequest& req) {
  if (req.body.empty()) bad_request("the request body is empty; send a JSON object");
  if (auto bad = find_invalid_utf8(req.body)) {
    bad_request("the request body is not valid UTF-8 (invalid byte at offset {})", *bad);
  }
  return parse_client_json(req.body, "the request body");
}

void check_model_name(const ServerContext& context, const std::string& requested) {
  if (requested.empty() || context.is_served_model(requested)) return;
  throw ApiError(404, fmt::format("The model `{}` does not exist.", requested), "model");
}

void check_prompt_ids(const std::vector<int32_t>& ids, int vocab_size, std::string_view field) {
  if (ids.empty()) bad_field(field, "is empty: the prompt must contain at least one token");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      bad_field(field, "contains token id {} at position {}, outside the vocabulary [0, {})",
                ids[i], i, vocab_size);
    }
  }
}

int resolve_max_tokens(const CommonRequest& request, const ModelContext& model, int prompt_tokens,
                       std::string_view prompt_field, std::string_view max_tokens_field) {
  const int limit = model.max_model_len;
  // A prompt may fill the whole context only when nothing is to be generated (echo scoring).
  const bool prompt_only = request.max_tokens && *request.max_tokens == 0;
  if (prompt_tokens > limit || (prompt_tokens == limit && !prompt_only)) {
    throw ApiError(
        400,
        fmt::format("This model's maximum context length is {} tokens. However, your "
                    "request has {} input tokens. Please reduce the length of the input.",
                    limit, prompt_tokens),
        std::string(prompt_field));
  }
  const int room = limit - prompt_tokens;
  if (request.max_tokens) {
    if (*request.max_tokens > room) {
      throw ApiError(400,
                     fmt::format("'{}' is too large: {}. This model's maximum context "
                                 "length is {} tokens and your request has {} input tokens ({} > "
                                 "{} - {}).",
                                 max_tokens_field, *request.max_tokens, limit, prompt_tokens,
                                 *request.max_tokens, limit, prompt_tokens),
                     std::string(max_tokens_field));
    }
    return static_cast<int>(*request.max_tokens);
  }
  if (model.defaults.max_new_tokens) {
    return static_cast<int>(std::min<int64_t>(*model.defaults.max_new_tokens, room));
  }
  return room;
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decoded(std::string_view text, std::string_view what, bool plus_is_space = true) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+' && plus_is_space) {
      out += ' ';
    } else if (text[i] != '%') {
      out += text[i];
    } else {
      const int hi = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
      const int lo = hi >= 0 ? hex_digit(text[i + 2]) : -1;
      if (lo < 0) bad_field(what, "has a malformed percent escape");
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    }
  }
  return out;
}

}  // namespace

std::string path_segments_decoded(std::string_view segments, std::string_view what) {
  return percent_decoded(segments, what, /*plus_is_space=*/false);
}

std::vector<std::pair<std::string, std::string>> query_parameters(std::string_view target) {
  std::vector<std::pair<std::string, std::string>> out;
  const size_t question = target.find('?');
  if (question == std::string_view::npos) return out;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string key = percent_decoded(pair.substr(0, eq), pair.substr(0, eq));
    const std::string value =
        eq == std::string_view::npos ? std::string() : percent_decoded(pair.substr(eq + 1), key);
    out.emplace_back(key, value);
  }
  return out;
}

std::vector<EngineRequest> make_engine_requests(const std::string& id_prefix,
                                                const std::vector<int32_t>& prompt_ids,
                                                const SamplingParams& sampling, int n,
                                                const ModelContext& model) {
  std::vector<EngineRequest> requests;
  for (int j = 0; j < n; ++j) {
    EngineRequest r;
    r.id = n == 1 ? id_prefix : fmt::format("{}-{}", id_prefix, j);
    r.prompt_token_ids = prompt_ids;
    r.sampling = sampling;
    if (sampling.seed && j > 0) r.sampling.seed = *sampling.seed + static_cast<uint64_t>(j);
    r.eos_token_ids = model.eos_token_ids;
    requests.push_back(std::move(r));
  }
  return requests;
}

ChoiceDelta apply_output(ChoiceState& choice, const RequestOutput& output, int choice_index,
                         GenerationJob& job, const std::vector<int32_t>& stop_token_ids) {
  if (output.finished) choice.engine_finished = true;
  if (output.prompt_logprobs && !choice.prompt_logprobs)
    choice.prompt_logprobs = output.prompt_logprobs;
  if (output.num_prompt_tokens > 0) {
    choice.prompt_tokens = output.num_prompt_tokens;
    choice.cached_tokens = output.num_cached_prompt_tokens;
  }
  if (choice.ended) return {};  // a stop string already ended it: later tokens are not output

  choice.completion_tokens += static_cast<int>(output.new_token_ids.size());
  choice.output_ids.insert(choice.output_ids.end(), output.new_token_ids.begin(),
                           output.new_token_ids.end());
  choice.logprobs.insert(choice.logprobs.end(), output.logprobs.begin(), output.logprobs.end());

  const bool stop_token = output.finish_reason == FinishReason::kStop && output.stop_token_id;
  ChoiceDelta delta = choice.text.add_tokens(output.new_token_ids, stop_token);
  auto merge = [&](ChoiceDelta more) {
    delta.content += more.content;
    delta.reasoning += more.reasoning;
    for (auto& call : more.tool_calls) {
      auto same = std::find_if(delta.tool_calls.begin(), delta.tool_calls.end(),
                               [&](const text::ToolCallDelta& d) { return d.index == call.index; });
      if (same == delta.tool_calls.end()) {
        delta.tool_calls.push_back(std::move(call));
      } else {
        if (!same->id) same->id = call.id;
        if (!same->name) same->name = call.name;
        same->arguments_delta += call.arguments_delta;
      }
    }
  };

  if (choice.text.stopped()) {
    choice.ended = true;
    choice.end = {"stop", choice.text.stopped_by_string()
                              ? nlohmann::json(choice.text.matched_stop_string())
                              : nlohmann::json(nullptr)};
    if (!output.finished) job.abort(choice_index);
  } else if (output.finished) {
    merge(choice.text.finish());
    choice.ended = true;
    switch (output.finish_reason) {
      case FinishReason::kStop: {
        nlohmann::json reason = nullptr;
        if (output.stop_token_id && std::find(stop_token_ids.begin(), stop_token_ids.end(),
                                              *output.stop_token_id) != stop_token_ids.end()) {
          reason = *output.stop_token_id;
        }
        choice.end = {"stop", reason};
        break;
      }
      case FinishReason::kLength:
        choice.end = {"length", nullptr};
        break;
      case FinishReason::kError:
        choice.end = {"error", nullptr};
        choice.error = output.error.empty() ? "the engine failed this request" : output.error;
        break;
      default:
        choice.end = {"abort", nullptr};
        break;
    }
    if (choice.text.stopped_by_string()) choice.end = {"stop", choice.text.matched_stop_string()};
  }
  if (choice.ended && choice.end.finish_reason == "stop" && choice.text.saw_tool_call()) {
    choice.end.finish_reason = "tool_calls";
  }
  return delta;
}

void count_finished(ServerMetrics& metrics, const ChoiceState& choice) {
  const std::string& reason = choice.end.finish_reason;
  FinishedReason r = reason == "length"  ? FinishedReason::kLength
                     : reason == "abort" ? FinishedReason::kAbort
                     : reason == "error" ? FinishedReason::kError
                                         : FinishedReason::kStop;
  metrics.count_finished(r);
  metrics.observe_request_tokens(choice.prompt_tokens, choice.completion_tokens);
}

void count_abandoned(ServerMetrics& metrics,
                     const std::vector<std::unique_ptr<ChoiceState>>& choices) {
  for (const auto& choice : choices) {
    if (choice->ended) continue;
    choice->ended = true;
    choice->end = {"abort", nullptr};
    count_finished(metrics, *choice);
  }
}

nlohmann::json total_usage(const std::vector<std::unique_ptr<ChoiceState>>& choices, bool prompt_tokens_details) {
  int64_t prompt = 0, completion = 0, cached = 0;
  int last_prompt = -1;
  for (const auto& choice : choices) {
    if (choice->prompt_index != last_prompt) {
      prompt += choice->prompt_tokens;
      cached += choice->cached_tokens;
      last_prompt = choice->prompt_index;
    }
    completion += choice->completion_tokens;
  }
  return usage_json(prompt, completion, prompt_tokens_details ? std::optional<int64_t>(cached) : std::nullopt);
}

}  // namespace m3::server
