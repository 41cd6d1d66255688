#include "server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/json_parse.h"
#include "server/structured_output_request.h"

namespace m3::server {
namespace {

using json = Json;

void require_object_body(const json& body) {
  if (!body.is_object()) {
    bad_request("the request body must be a JSON object, got {}", json_type_name(body));
  }
}

// Known OpenAI / vLLM fields whose behaviour m3serve does not implement: refusing them is better
// than an answer that silently ignores a constraint the client relies on.
void reject_unsupported(const json& body) {
  static constexpr const char* kUnsupported[][2] = {
      {"suffix", "text insertion (suffix) is not supported"},
      {"functions", "the legacy 'functions' field is not supported; use 'tools'"},
      {"function_call", "the legacy 'function_call' field is not supported; use 'tool_choice'"},
      {"audio", "audio output is not supported"},
      {"prediction", "predicted outputs are not supported"},
      {"chat_template",
       "a per-request chat template is not supported; start the server with --chat-template"},
      {"web_search_options", "web search is not supported"},
  };
  for (const auto& [field, why] : kUnsupported) {
    auto it = body.find(field);
    if (it != body.end() && !it->is_null()) {
      throw ApiError(400, fmt::format("'{}': {}", field, why), field);
    }
  }
  if (const json* modalities = read_array(body, "modalities")) {
    for (size_t i = 0; i < modalities->size(); ++i) {
      std::string path = fmt::format("modalities[{}]", i);
      if (as_string((*modalities)[i], path) != "text") {
        bad_field(path, "is not supported: m3serve produces text only");
      }
    }
  }
}

void check_range(std::string_view field, double value, double lo, double hi, bool lo_open) {
  // The engine samples with 32-bit floats: a larger value would become an infinity there.
  if (std::fabs(value) > std::numeric_limits<float>::max()) {
    bad_field(field, "is {}, too large (at most {} for a sampling parameter)", value,
              std::numeric_limits<float>::max());
  }
  bool ok = (lo_open ? value > lo : value >= lo) && value <= hi;
  if (!ok) {
    if (hi == std::numeric_limits<double>::infinity()) {
      bad_field(field, "must be {} {}, got {}", lo_open ? ">" : ">=", lo, value);
    }
    bad_field(field, "must be in {}{}, {}], got {}", lo_open ? "(" : "[", lo, hi, value);
  }
}

}  // namespace

SamplingRequest parse_sampling(const json& body) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  SamplingRequest s;
  if ((s.temperature = read_number(body, "temperature"))) {
    check_range("temperature", *s.temperature, 0.0, kInf, false);
  }
  if ((s.top_p = read_number(body, "top_p"))) check_range("top_p", *s.top_p, 0.0, 1.0, true);
  if ((s.min_p = read_number(body, "min_p"))) check_range("min_p", *s.min_p, 0.0, 1.0, false);
  if ((s.presence_penalty = read_number(body, "presence_penalty"))) {
    check_range("presence_penalty", *s.presence_penalty, -2.0, 2.0, false);
  }
  if ((s.frequency_penalty = read_number(body, "frequency_penalty"))) {
    check_range("frequency_penalty", *s.frequency_penalty, -2.0, 2.0, false);
  }
  if ((s.repetition_penalty = read_number(body, "repetition_penalty"))) {
    check_range("repetition_penalty", *s.repetition_penalty, 0.0, kInf, true);
  }
  if ((s.top_k = read_int(body, "top_k"))) {
    if (*s.top_k < -1) bad_field("top_k", "must be -1 or 0 (disabled) or >= 1, got {}", *s.top_k);
    if (*s.top_k > std::numeric_limits<int32_t>::max())
      bad_field("top_k", "is too large: {}", *s.top_k);
  }
  if (auto seed = read_int(body, "seed")) s.seed = static_cast<uint64_t>(*seed);
  if (const json* bias = read_object(body, "logit_bias")) {
    for (const auto& [key, value] : bias->items()) {
      const std::string path = "logit_bias." + key;
      int64_t id = -1;
      const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (error != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 ||
          id > std::numeric_limits<int32_t>::max()) {
        bad_field(path, "must be keyed by a token id (a non-negative integer as a string), got '{}'", key);
      }
      if (!value.is_number()) bad_field(path, "must be a number in [-100, 100], got {}", json_type_name(value));
      check_range(path, value.get<double>(), -100.0, 100.0, false);
      s.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<double>());
    }
    std::sort(s.logit_bias.begin(), s.logit_bias.end());
    for (size_t i = 1; i < s.logit_bias.size(); ++i) {
      if (s.logit_bias[i].first == s.logit_bias[i - 1].first) {
        bad_field(fmt::format("logit_bias.{}", s.logit_bias[i].first), "names the same token twice");
      }
    }
  }
  return s;
}

namespace {

std::vector<std::string> parse_stop(const json& body, const RequestLimits& limits) {
  std::vector<std::string> stops;
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      stops.push_back(as_string((*it)[i], fmt::format("stop[{}]", i)));
    }
  } else {
    bad_field("stop", "must be a string or an array of strings, got {}", json_type_name(*it));
  }
  if (static_cast<int>(stops.size()) > limits.max_stop_strings) {
    bad_field("stop", "has {} strings; at most {} are allowed", stops.size(),
              limits.max_stop_strings);
  }
  for (const std::string& s : stops) {
    if (s.empty()) bad_field("stop", "must not contain empty strings");
  }
  return stops;
}

std::vector<int32_t> parse_token_id_array(const json& array, std::string_view path) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    std::string element = fmt::format("{}[{}]", path, i);
    int64_t id = as_int(array[i], element);
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      bad_field(element, "is not a valid token id: {}", id);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

int parse_logprobs_count(const json& body, std::string_view key, const RequestLimits& limits) {
  auto value = read_int(body, key);
  if (!value) return -1;
  if (*value < 0 || *value > limits.max_logprobs) {
    bad_field(key, "must be in [0, {}], got {}", limits.max_logprobs, *value);
  }
  return static_cast<int>(*value);
}

CommonRequest parse_common(const json& body, const RequestLimits& limits, bool chat) {
  reject_unsupported(body);
  CommonRequest c;
  c.model = read_string(body, "model").value_or("");

  if (auto n = read_int(body, "n")) {
    if (*n < 1 || *n > limits.max_n) bad_field("n", "must be in [1, {}], got {}", limits.max_n, *n);
    c.n = static_cast<int>(*n);
  }
  if (auto best_of = read_int(body, "best_of"); best_of && *best_of != c.n) {
    bad_field("best_of", "is not supported (it must equal n when given)");
  }

  const char* max_key = "max_tokens";
  if (chat && body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()) {
    max_key = "max_completion_tokens";
  }
  if ((c.max_tokens = read_int(body, max_key))) {
    if (*c.max_tokens < 0) {
      bad_field(max_key, "must be >= 1{}, got {}", chat ? "" : " (0 only with echo)",
                *c.max_tokens);
    }
    if (*c.max_tokens > std::numeric_limits<int32_t>::max()) {
      bad_field(max_key, "is too large: {}", *c.max_tokens);
    }
  }
  if (auto min_tokens = read_int(body, "min_tokens")) {
    if (*min_tokens < 0) bad_field("min_tokens", "must be >= 0, got {}", *min_tokens);
    if (c.max_tokens && *min_tokens > *c.max_tokens) {
      bad_field("min_tokens", "({}) must not exceed {} ({})", *min_tokens, max_key, *c.max_tokens);
    }
    c.min_tokens = *min_tokens;
  }

  c.sampling = parse_sampling(body);
  c.stop = parse_stop(body, limits);
  if (const json* ids = read_array(body, "stop_token_ids")) {
    c.stop_token_ids = parse_token_id_array(*ids, "stop_token_ids");
  }
  c.include_stop_str_in_output = read_bool(body, "include_stop_str_in_output").value_or(false);
  c.ignore_eos = read_bool(body, "ignore_eos").value_or(false);
  c.skip_special_tokens = read_bool(body, "skip_special_tokens").value_or(true);
  c.return_token_ids = read_bool(body, "return_token_ids").value_or(false);

  c.stream = read_bool(body, "stream").value_or(false);
  if (const json* options = read_object(body, "stream_options")) {
    if (!c.stream) bad_field("stream_options", "is only allowed when 'stream' is true");
    c.include_usage =
        read_bool(*options, "include_usage", "stream_options.include_usage").value_or(false);
    c.continuous_usage_stats =
        read_bool(*options, "continuous_usage_stats", "stream_options.continuous_usage_stats")
            .value_or(false);
  }

  c.prompt_logprobs = parse_logprobs_count(body, "prompt_logprobs", limits);
  return c;
}

// ---- prompts of /v1/completions ----

std::vector<PromptInput> parse_prompts(const json& body) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) bad_field("prompt", "is required");
  std::vector<PromptInput> prompts;
  const json& prompt = *it;
  if (prompt.is_string()) {
    prompts.push_back({false, prompt.get<std::string>(), {}});
    return prompts;
  }
  if (!prompt.is_array()) {
    bad_field("prompt",
              "must be a string, an array of strings, an array of token ids or an "
              "array of token-id arrays, got {}",
              json_type_name(prompt));
  }
  if (prompt.empty()) bad_field("prompt", "must not be empty");
  const json& first = prompt.front();
  if (first.is_number()) {
    prompts.push_back({true, {}, parse_token_id_array(prompt, "prompt")});
    return prompts;
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    std::string path = fmt::format("prompt[{}]", i);
    const json& item = prompt[i];
    if (first.is_string()) {
      prompts.push_back({false, as_string(item, path), {}});
    } else if (first.is_array() && item.is_array()) {
      if (item.empty()) bad_field(path, "must not be empty");
      prompts.push_back({true, {}, parse_token_id_array(item, path)});
    } else {
      bad_field(path,
                "has the wrong type ({}): prompts in one batch must all be strings or all "
                "token-id arrays",
                json_type_name(item));
    }
  }
  return prompts;
}

// ---- messages of /v1/chat/completions ----

}  // namespace

std::string join_text_parts(const json& parts, std::string_view path) {
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    std::string part_path = fmt::format("{}[{}]", path, j);
    const json& part = parts[j];
    if (part.is_string()) {  // vLLM accepts bare strings as text parts
      if (!text.empty()) text += '\n';
      text += part.get<std::string>();
      continue;
    }
    if (!part.is_object()) bad_field(part_path, "must be an object, got {}", json_type_name(part));
    std::string type = read_string(part, "type", part_path + ".type").value_or("");
    if (type == "text" || type == "input_text" || type == "output_text") {
      auto part_text = read_string(part, "text", part_path + ".text");
      if (!part_text) bad_field(part_path + ".text", "is required for a text part");
      if (!text.empty()) text += '\n';
      text += *part_text;
    } else if (type == "refusal") {
      if (!text.empty()) text += '\n';
      text += read_string(part, "refusal", part_path + ".refusal").value_or("");
    } else if (type.empty()) {
      bad_field(part_path + ".type", "is required");
    } else {
      bad_field(part_path, "of type '{}' is not supported: m3serve serves text-only models", type);
    }
  }
  return text;
}

namespace {

json normalize_tool_calls(const json& calls, std::string_view path) {
  json out = json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    std::string call_path = fmt::format("{}[{}]", path, j);
    json call = calls[j];
    if (!call.is_object()) bad_field(call_path, "must be an object, got {}", json_type_name(call));
    const json* function = read_object(call, "function", call_path + ".function");
    if (!function) bad_field(call_path + ".function", "is required");
    if (!read_string(*function, "name", call_path + ".function.name")) {
      bad_field(call_path + ".function.name", "is required");
    }
    // Templates iterate the arguments as a mapping (transformers passes dicts); OpenAI clients
    // send them as a JSON string, so parse it here as vLLM does.
    auto args = call["function"].find("arguments");
    if (args != call["function"].end() && args->is_string()) {
      // The arguments are client JSON like the body: parsed with the same depth cap.
      const std::string field = call_path + ".function.arguments";
      *args = parse_client_json(args->get<std::string>(), fmt::format("'{}'", field), field);
    }
    out.push_back(std::move(call));
  }
  return out;
}

json normalize_messages(const json& body) {
  const json* messages = read_array(body, "messages");
  if (!messages) bad_field("messages", "is required");
  if (messages->empty()) bad_field("messages", "must contain at least one message");
  json out = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    std::string path = fmt::format("messages[{}]", i);
    const json& message = (*messages)[i];
    if (!message.is_object()) bad_field(path, "must be an object, got {}", json_type_name(message));
    auto role = read_string(message, "role", path + ".role");
    if (!role || role->empty()) bad_field(path + ".role", "is required");
    if (*role == "function")
      bad_field(path + ".role", "'function' messages are not supported; use 'tool'");
    json normalized = message;

    auto content = message.find("content");
    if (content != message.end() && content->is_array()) {
      normalized["content"] = join_text_parts(*content, path + ".content");
    } else if (content != message.end() && !content->is_null() && !content->is_string()) {
      bad_field(path + ".content", "must be a string, an array of content parts or null, got {}",
                json_type_name(*content));
    }
    bool has_content = content != message.end() && !content->is_null();

    if (const json* calls = read_array(message, "tool_calls", path + ".tool_calls")) {
      if (*role != "assistant")
        bad_field(path + ".tool_calls", "is only allowed on assistant messages");
      normalized["tool_calls"] = normalize_tool_calls(*calls, path + ".tool_calls");
    }
    if (*role == "assistant") {
      if (!normalized.contains("reasoning_content") || normalized["reasoning_content"].is_null()) {
        if (auto reasoning = read_string(message, "reasoning", path + ".reasoning")) {
          normalized["reasoning_content"] = *reasoning;
        }
      } else {
        read_string(message, "reasoning_content", path + ".reasoning_content");
      }
    } else if (!has_content) {
      bad_field(path + ".content", "is required for '{}' messages", *role);
    }
    if (*role == "tool") read_string(message, "tool_call_id", path + ".tool_call_id");
    out.push_back(std::move(normalized));
  }
  return out;
}

json parse_tools(const json& body) {
  const json* tools = read_array(body, "tools");
  if (!tools) return nullptr;
  for (size_t i = 0; i < tools->size(); ++i) {
    std::string path = fmt::format("tools[{}]", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) bad_field(path, "must be an object, got {}", json_type_name(tool));
    std::string type = read_string(tool, "type", path + ".type").value_or("function");
    if (type != "function")
      bad_field(path + ".type", "'{}' is not supported (only 'function')", type);
    const json* function = read_object(tool, "function", path + ".function");
    if (!function) bad_field(path + ".function", "is required");
    auto name = read_string(*function, "name", path + ".function.name");
    if (!name || name->empty()) bad_field(path + ".function.name", "is required");
    read_string(*function, "description", path + ".function.description");
    read_object(*function, "parameters", path + ".function.parameters");
  }
  return *tools;
}

void parse_tool_choice(const json& body, ChatRequest& r) {
  bool has_tools = r.tools.is_array() && !r.tools.empty();
  r.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  r.tool_choice_given = true;
  if (it->is_string()) {
    const std::string& mode = it->get_ref<const std::string&>();
    if (mode == "none") {
      r.tool_choice = ToolChoice::kNone;
    } else if (mode == "auto") {
      r.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
    } else if (mode == "required") {
      if (!has_tools) bad_field("tool_choice", "'required' needs a non-empty 'tools' list");
      r.tool_choice = ToolChoice::kRequired;
    } else {
      bad_field("tool_choice", "must be 'none', 'auto', 'required' or a named function, got '{}'",
                mode);
    }
    return;
  }
  if (!it->is_object()) {
    bad_field("tool_choice", "must be a string or an object, got {}", json_type_name(*it));
  }
  const json* function = read_object(*it, "function", "tool_choice.function");
  auto name = function ? read_string(*function, "name", "tool_choice.function.name") : std::nullopt;
  if (!name) bad_field("tool_choice.function.name", "is required for a named tool choice");
  if (!has_tools) bad_field("tool_choice", "names a function but 'tools' is empty");
  bool found = false;
  for (const json& tool : r.tools) found = found || tool["function"]["name"] == *name;
  if (!found) bad_field("tool_choice.function.name", "'{}' is not one of the given tools", *name);
  r.tool_choice = ToolChoice::kNamed;
  r.tool_choice_name = *name;
}

void parse_response_format(const json& body, ChatRequest& r) {
  const json* format = read_object(body, "response_format");
  if (!format) return;
  auto type = read_string(*format, "type", "response_format.type");
  if (!type) bad_field("response_format.type", "is required");
  if (*type == "text" || *type == "json_object") {
    r.response_format = *type;
  } else if (*type == "json_schema") {
    const json* spec = read_object(*format, "json_schema", "response_format.json_schema");
    if (!spec) bad_field("response_format.json_schema", "is required for type 'json_schema'");
    const json* schema = read_object(*spec, "schema", "response_format.json_schema.schema");
    r.response_format = *type;
    r.response_schema = schema ? *schema : json::object();
  } else {
    bad_field("response_format.type", "'{}' is not supported (text, json_object, json_schema)",
              *type);
  }
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, const RequestLimits& limits) {
  require_object_body(body);
  CompletionRequest r;
  r.common = parse_common(body, limits, /*chat=*/false);
  r.prompts = parse_prompts(body);
  r.echo = read_bool(body, "echo").value_or(false);
  r.add_special_tokens = read_bool(body, "add_special_tokens").value_or(true);
  // Completions take the number of top logprobs directly.
  if (auto it = body.find("logprobs"); it != body.end() && it->is_boolean()) {
    bad_field("logprobs", "must be an integer (the number of top logprobs) for completions");
  }
  r.common.logprobs = parse_logprobs_count(body, "logprobs", limits);
  r.common.structured = parse_structured_output(body);
  // OpenAI's completions default is 16 tokens (vLLM keeps it).
  if (!r.common.max_tokens) r.common.max_tokens = 16;
  if (*r.common.max_tokens == 0 && !r.echo)
    bad_field("max_tokens", "must be >= 1 (0 only with echo)");
  return r;
}

ChatRequest parse_chat_request(const json& body, const RequestLimits& limits) {
  require_object_body(body);
  ChatRequest r;
  r.common = parse_common(body, limits, /*chat=*/true);
  if (r.common.max_tokens && *r.common.max_tokens == 0) {
    bad_field(body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
              "must be >= 1, got 0");
  }
  r.messages = normalize_messages(body);
  r.tools = parse_tools(body);
  parse_tool_choice(body, r);
  parse_response_format(body, r);
  r.common.structured = parse_structured_output(body);
  r.parallel_tool_calls = read_bool(body, "parallel_tool_calls").value_or(true);
  if (r.common.structured && (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed)) {
    throw ApiError(400,
                   fmt::format("'{}' cannot be combined with a required or named tool_choice (the output is then "
                               "a tool call)",
                               r.common.structured->field),
                   r.common.structured->field);
  }

  if (auto effort = read_string(body, "reasoning_effort")) {
    static constexpr std::string_view kEfforts[] = {"none",   "minimal", "low",
                                                    "medium", "high",    "xhigh"};
    bool known = false;
    for (std::string_view e : kEfforts) known = known || e == *effort;
    if (!known)
      bad_field("reasoning_effort",
                "must be one of none, minimal, low, medium, high, xhigh; got '{}'", *effort);
    r.reasoning_effort = *effort;
  }
  if (const json* kwargs = read_object(body, "chat_template_kwargs"))
    r.chat_template_kwargs = *kwargs;
  r.add_generation_prompt = read_bool(body, "add_generation_prompt").value_or(true);
  r.continue_final_message = read_bool(body, "continue_final_message").value_or(false);
  if (r.add_generation_prompt && r.continue_final_message) {
    bad_request("'add_generation_prompt' and 'continue_final_message' cannot both be true");
  }
  r.add_special_tokens = read_bool(body, "add_special_tokens").value_or(false);

  bool logprobs = read_bool(body, "logprobs").value_or(false);
  if (auto top = read_int(body, "top_logprobs")) {
    if (*top < 0 || *top > limits.max_logprobs) {
      bad_field("top_logprobs", "must be in [0, {}], got {}", limits.max_logprobs, *top);
    }
    if (!logprobs && *top > 0) bad_field("top_logprobs", "requires 'logprobs' to be true");
    r.top_logprobs = static_cast<int>(*top);
  }
  r.common.logprobs = logprobs ? r.top_logprobs : -1;
  return r;
}

}  // namespace m3::server
