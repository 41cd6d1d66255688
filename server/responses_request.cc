#include "server/responses_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/json_parse.h"
#include "server/openai_response.h"
#include "server/structured_output_request.h"

namespace m3::server {
namespace {

using json = Json;

// Every top-level field of the Responses API (openai@6's ResponseCreateParams) and the vLLM
// sampling extensions. Any other field is a 400: see the header.
constexpr std::string_view kKnownFields[] = {
    "model", "input", "instructions", "max_output_tokens", "max_tool_calls", "temperature",
    "top_p", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
    "previous_response_id", "store", "stream", "stream_options", "metadata", "user",
    "include", "truncation", "background", "safety_identifier", "prompt_cache_key",
    "prompt_cache_retention", "service_tier", "conversation", "prompt", "top_logprobs",
    "context_management", "moderation",
    // vLLM's sampling extensions, range-checked as in the chat route.
    "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed"};

// Hosted tools and other tool kinds OpenAI runs itself: nothing here can run them.
constexpr std::string_view kHostedTools[] = {
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "computer", "computer_use_preview", "computer_use",
    "image_generation", "mcp", "local_shell", "shell", "apply_patch", "custom", "tool_search",
    "namespace"};

bool is_hosted_tool(std::string_view type) {
  return std::find(std::begin(kHostedTools), std::end(kHostedTools), type) !=
         std::end(kHostedTools);
}

void reject_unknown_and_unsupported(const json& body) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(std::begin(kKnownFields), std::end(kKnownFields), key) ==
        std::end(kKnownFields)) {
      throw ApiError(400,
                     fmt::format("'{}' is not a field of the Responses API that m3serve "
                                 "implements; remove it",
                                 key),
                     key);
    }
  }
  auto given = [&](const char* key) {
    auto it = body.find(key);
    return it != body.end() && !it->is_null();
  };
  if (given("conversation")) {
    bad_field("conversation",
              "is not supported: m3serve has no conversations API; chain responses with "
              "previous_response_id");
  }
  if (given("prompt")) bad_field("prompt", "(stored prompt templates) is not supported");
  if (given("context_management")) bad_field("context_management", "is not supported");
  if (given("moderation")) bad_field("moderation", "is not supported");
  if (auto truncation = read_string(body, "truncation"); truncation && *truncation != "disabled") {
    bad_field("truncation",
              "'{}' is not supported: only 'disabled' (a conversation longer than the context is "
              "a 400)",
              *truncation);
  }
  if (auto retention = read_string(body, "prompt_cache_retention");
      retention && *retention != "in_memory") {
    bad_field("prompt_cache_retention", "'{}' is not supported: only 'in_memory'", *retention);
  }
  read_string(body, "safety_identifier");
  read_string(body, "prompt_cache_key");
  read_string(body, "service_tier");
  if (const json* include = read_array(body, "include")) {
    for (size_t i = 0; i < include->size(); ++i) {
      const std::string path = fmt::format("include[{}]", i);
      const std::string& what = as_string((*include)[i], path);
      if (what != "reasoning.encrypted_content" && what != "message.output_text.logprobs") {
        bad_field(path,
                  "'{}' is not supported (only 'message.output_text.logprobs' and "
                  "'reasoning.encrypted_content', which m3serve answers with plain reasoning_text)",
                  what);
      }
    }
  }
}

// {type: function, name, description, parameters, strict} -> the chat shape
// {type: function, function: {name, description, parameters, strict}}.
void parse_tools(const json& body, ResponsesRequest& r) {
  const json* tools = read_array(body, "tools");
  if (!tools || tools->empty()) return;
  json chat_tools = json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string path = fmt::format("tools[{}]", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) bad_field(path, "must be an object, got {}", json_type_name(tool));
    auto type = read_string(tool, "type", path + ".type");
    if (!type) bad_field(path + ".type", "is required");
    if (is_hosted_tool(*type)) {
      bad_field(path + ".type",
                "'{}' is a hosted tool, which m3serve does not provide; only 'function' tools are "
                "supported",
                *type);
    }
    if (*type != "function") bad_field(path + ".type", "'{}' is not supported (only 'function')", *type);
    if (tool.contains("function")) {
      bad_field(path + ".function",
                "is the chat completions shape; Responses function tools are flat: "
                "{{type, name, description, parameters, strict}}");
    }
    json function = json::object();
    for (const auto& [key, value] : tool.items()) {
      if (key == "type") continue;
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        bad_field(path + "." + key, "is not a field of a function tool");
      }
    }
    auto name = read_string(tool, "name", path + ".name");
    if (!name || name->empty()) bad_field(path + ".name", "is required");
    if (!names.insert(*name).second) bad_field(path + ".name", "'{}' is given twice", *name);
    function["name"] = *name;
    if (auto description = read_string(tool, "description", path + ".description")) {
      function["description"] = *description;
    }
    if (const json* parameters = read_object(tool, "parameters", path + ".parameters")) {
      function["parameters"] = *parameters;
    }
    if (auto strict = read_bool(tool, "strict", path + ".strict")) function["strict"] = *strict;
    chat_tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  r.tools = nlohmann::json(*tools);
  r.chat.tools = std::move(chat_tools);
}

// "none" | "auto" | "required" | {type: function, name}: the chat route's tool choices.
void parse_tool_choice(const json& body, ResponsesRequest& r) {
  const bool has_tools = r.chat.tools.is_array() && !r.chat.tools.empty();
  r.chat.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  r.tool_choice = has_tools ? "auto" : "none";
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  r.chat.tool_choice_given = true;
  if (it->is_string()) {
    const std::string& mode = it->get_ref<const std::string&>();
    if (mode == "none") {
      r.chat.tool_choice = ToolChoice::kNone;
    } else if (mode == "auto") {
      // No tools: nothing to call, as in the chat route.
    } else if (mode == "required") {
      if (!has_tools) bad_field("tool_choice", "'required' needs a non-empty 'tools' list");
      r.chat.tool_choice = ToolChoice::kRequired;
    } else {
      bad_field("tool_choice", "must be 'none', 'auto', 'required' or {{type: 'function', name}}, got '{}'",
                mode);
    }
    r.tool_choice = mode;
    return;
  }
  if (!it->is_object()) {
    bad_field("tool_choice", "must be a string or an object, got {}", json_type_name(*it));
  }
  auto type = read_string(*it, "type", "tool_choice.type");
  if (!type) bad_field("tool_choice.type", "is required");
  if (*type != "function") {
    bad_field("tool_choice.type", "'{}' is not supported{}", *type,
              is_hosted_tool(*type) ? " (a hosted tool m3serve does not provide)"
                                    : " (only 'function', or the strings none / auto / required)");
  }
  auto name = read_string(*it, "name", "tool_choice.name");
  if (!name) bad_field("tool_choice.name", "is required for a function tool choice");
  if (!has_tools) bad_field("tool_choice", "names a function but 'tools' is empty");
  bool found = false;
  for (const json& tool : r.chat.tools) found = found || tool["function"]["name"] == *name;
  if (!found) bad_field("tool_choice.name", "'{}' is not one of the given tools", *name);
  r.chat.tool_choice = ToolChoice::kNamed;
  r.chat.tool_choice_name = *name;
  r.tool_choice = {{"type", "function"}, {"name", *name}};
}

// text.format -> the chat route's response_format: the same prompt instruction, and the same
// grammar constraint (structured outputs), so the output is JSON that validates.
void parse_text(const json& body, ResponsesRequest& r) {
  const json* text = read_object(body, "text");
  if (!text) return;
  for (const auto& [key, value] : text->items()) {
    if (key != "format" && key != "verbosity") bad_field("text." + key, "is not supported");
  }
  if (auto verbosity = read_string(*text, "verbosity", "text.verbosity")) {
    if (*verbosity != "low" && *verbosity != "medium" && *verbosity != "high") {
      bad_field("text.verbosity", "must be low, medium or high, got '{}'", *verbosity);
    }
  }
  const json* format = read_object(*text, "format", "text.format");
  if (!format) return;
  auto type = read_string(*format, "type", "text.format.type");
  if (!type) bad_field("text.format.type", "is required");
  json chat_format = {{"type", *type}};
  if (*type == "text" || *type == "json_object") {
    r.chat.response_format = *type;
  } else if (*type == "json_schema") {
    auto name = read_string(*format, "name", "text.format.name");
    if (!name || name->empty()) bad_field("text.format.name", "is required for type 'json_schema'");
    const json* schema = read_object(*format, "schema", "text.format.schema");
    if (!schema) bad_field("text.format.schema", "is required for type 'json_schema'");
    read_string(*format, "description", "text.format.description");
    read_bool(*format, "strict", "text.format.strict");
    r.chat.response_format = *type;
    r.chat.response_schema = *schema;
    chat_format["json_schema"] = {{"name", *name}, {"schema", *schema}};
    if (const json* strict = format->contains("strict") ? &(*format)["strict"] : nullptr) {
      chat_format["json_schema"]["strict"] = *strict;
    }
  } else {
    bad_field("text.format.type", "'{}' is not supported (text, json_object, json_schema)", *type);
  }
  r.text_format = nlohmann::json(*format);
  try {
    r.chat.common.structured = parse_structured_output(json{{"response_format", chat_format}});
  } catch (const ApiError& e) {  // name the field as this API spells it
    std::string param = e.param();
    if (param.rfind("response_format.json_schema.schema", 0) == 0) {
      param = "text.format.schema" + param.substr(std::string("response_format.json_schema.schema").size());
    }
    throw ApiError(e.status(), e.what(), param.empty() ? "text.format" : param);
  }
}

// reasoning.effort: "none" turns M3's thinking off (thinking_mode disabled), any other effort on
// (enabled); the effort itself reaches the template as reasoning_effort, as in the chat route.
// Without it the template's default (adaptive) applies.
void parse_reasoning(const json& body, ResponsesRequest& r) {
  const json* reasoning = read_object(body, "reasoning");
  if (!reasoning) return;
  for (const auto& [key, value] : reasoning->items()) {
    if (key != "effort" && key != "summary" && key != "generate_summary") {
      bad_field("reasoning." + key, "is not supported");
    }
  }
  if (auto effort = read_string(*reasoning, "effort", "reasoning.effort")) {
    static constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), *effort) == std::end(kEfforts)) {
      bad_field("reasoning.effort", "must be one of none, minimal, low, medium, high, xhigh; got '{}'",
                *effort);
    }
    r.chat.reasoning_effort = *effort;
    r.chat.chat_template_kwargs["thinking_mode"] = *effort == "none" ? "disabled" : "enabled";
    r.reasoning["effort"] = *effort;
  }
  for (const char* key : {"summary", "generate_summary"}) {
    if (auto summary = read_string(*reasoning, key, fmt::format("reasoning.{}", key))) {
      if (*summary != "auto" && *summary != "concise" && *summary != "detailed") {
        bad_field(fmt::format("reasoning.{}", key), "must be auto, concise or detailed, got '{}'",
                  *summary);
      }
      r.reasoning["summary"] = *summary;
    }
  }
}

void parse_metadata(const json& body, ResponsesRequest& r) {
  const json* metadata = read_object(body, "metadata");
  if (!metadata) return;
  if (metadata->size() > 16) bad_field("metadata", "has {} keys; at most 16 are allowed", metadata->size());
  for (const auto& [key, value] : metadata->items()) {
    if (!value.is_string()) {
      bad_field("metadata." + key, "must be a string, got {}", json_type_name(value));
    }
  }
  r.metadata = nlohmann::json(*metadata);
}

// ---- input items -> chat messages ----

// Text of a content field: a string or an array of text parts.
std::string content_text(const json& item, std::string_view key, const std::string& path) {
  auto it = item.find(key);
  if (it == item.end() || it->is_null()) bad_field(path, "is required");
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) return join_text_parts(*it, path);
  bad_field(path, "must be a string or an array of content parts, got {}", json_type_name(*it));
}

// Only these keys may appear on an item of `type`; another one would be a feature dropped.
void check_item_keys(const json& item, const std::string& path,
                     std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : item.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      bad_field(path + "." + key, "is not supported on this item");
    }
  }
}

std::string reasoning_text(const json& item, const std::string& path) {
  if (auto it = item.find("encrypted_content"); it != item.end() && !it->is_null()) {
    bad_field(path + ".encrypted_content",
              "cannot be read: m3serve never encrypts reasoning; send its reasoning_text content");
  }
  auto join = [&](const char* key, std::string_view part_type) {
    const json* parts = read_array(item, key, path + "." + key);
    if (!parts) return std::string();
    std::string out;
    for (size_t j = 0; j < parts->size(); ++j) {
      const std::string part_path = fmt::format("{}.{}[{}]", path, key, j);
      const json& part = (*parts)[j];
      if (!part.is_object()) bad_field(part_path, "must be an object, got {}", json_type_name(part));
      auto type = read_string(part, "type", part_path + ".type");
      if (type != part_type) bad_field(part_path + ".type", "must be '{}'", part_type);
      auto part_text = read_string(part, "text", part_path + ".text");
      if (!part_text) bad_field(part_path + ".text", "is required");
      if (!out.empty()) out += '\n';
      out += *part_text;
    }
    return out;
  };
  // The reasoning itself when the item carries it (m3serve's own items do); a summary only
  // stands in for it when there is nothing else.
  std::string text = join("content", "reasoning_text");
  std::string summary = join("summary", "summary_text");
  return text.empty() ? summary : text;
}

void collect_call_ids(const json& messages, std::set<std::string>& ids) {
  for (const json& message : messages) {
    auto calls = message.find("tool_calls");
    if (calls == message.end() || !calls->is_array()) continue;
    for (const json& call : *calls) {
      if (call.contains("id") && call["id"].is_string()) ids.insert(call["id"].get<std::string>());
    }
  }
}

}  // namespace

int ResponsesRequest::tool_call_limit() const {
  int64_t limit = parallel_tool_calls ? -1 : 1;
  if (max_tool_calls && (limit < 0 || *max_tool_calls < limit)) limit = *max_tool_calls;
  return static_cast<int>(limit);
}

ResponsesRequest parse_responses_request(const json& body, const RequestLimits& limits) {
  if (!body.is_object()) {
    bad_request("the request body must be a JSON object, got {}", json_type_name(body));
  }
  reject_unknown_and_unsupported(body);
  ResponsesRequest r;
  CommonRequest& c = r.chat.common;
  c.model = read_string(body, "model").value_or("");
  c.stream = read_bool(body, "stream").value_or(false);
  if (const json* options = read_object(body, "stream_options")) {
    if (!c.stream) bad_field("stream_options", "is only allowed when 'stream' is true");
    for (const auto& [key, value] : options->items()) {
      if (key != "include_obfuscation") bad_field("stream_options." + key, "is not supported");
    }
    read_bool(*options, "include_obfuscation", "stream_options.include_obfuscation");
  }
  if ((r.max_output_tokens = read_int(body, "max_output_tokens"))) {
    if (*r.max_output_tokens < 1) {
      bad_field("max_output_tokens", "must be >= 1, got {}", *r.max_output_tokens);
    }
    if (*r.max_output_tokens > std::numeric_limits<int32_t>::max()) {
      bad_field("max_output_tokens", "is too large: {}", *r.max_output_tokens);
    }
    c.max_tokens = r.max_output_tokens;
  }
  c.sampling = parse_sampling(body);
  if (auto top = read_int(body, "top_logprobs")) {
    if (*top < 0 || *top > limits.max_logprobs) {
      bad_field("top_logprobs", "must be in [0, {}], got {}", limits.max_logprobs, *top);
    }
    r.top_logprobs = static_cast<int>(*top);
  }
  if (const json* include = read_array(body, "include")) {
    r.output_logprobs = std::find(include->begin(), include->end(), json("message.output_text.logprobs")) !=
                        include->end();
  }
  r.chat.top_logprobs = r.top_logprobs;
  c.logprobs = r.output_logprobs ? r.top_logprobs : -1;

  auto input = body.find("input");
  if (input == body.end() || input->is_null()) bad_field("input", "is required");
  if (!input->is_string() && !input->is_array()) {
    bad_field("input", "must be a string or an array of input items, got {}", json_type_name(*input));
  }
  if (input->is_array() && input->empty()) bad_field("input", "must contain at least one item");
  r.input = *input;
  r.instructions = read_string(body, "instructions");
  r.previous_response_id = read_string(body, "previous_response_id");
  if (r.previous_response_id && r.previous_response_id->empty()) {
    bad_field("previous_response_id", "must not be empty");
  }
  r.store = read_bool(body, "store").value_or(true);
  r.background = read_bool(body, "background").value_or(false);
  if (r.background && !r.store) {
    bad_field("background", "needs store: true (a background response is read back with GET /v1/responses/{{id}})");
  }
  if (r.background && c.stream) {
    bad_field("stream", "with background: true is not supported: poll GET /v1/responses/{{id}} instead");
  }
  r.parallel_tool_calls = read_bool(body, "parallel_tool_calls").value_or(true);
  if ((r.max_tool_calls = read_int(body, "max_tool_calls")) && *r.max_tool_calls < 1) {
    bad_field("max_tool_calls", "must be >= 1, got {}", *r.max_tool_calls);
  }
  r.user = read_string(body, "user");

  parse_tools(body, r);
  parse_tool_choice(body, r);
  parse_text(body, r);
  parse_reasoning(body, r);
  parse_metadata(body, r);
  return r;
}

Json input_messages(const json& input, const json& history) {
  json out = json::array();
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return out;
  }
  std::set<std::string> call_ids;
  collect_call_ids(history, call_ids);
  std::string pending_reasoning;  // from reasoning items, for the next assistant turn
  auto assistant = [&](json message) {
    if (!pending_reasoning.empty()) message["reasoning_content"] = std::exchange(pending_reasoning, {});
    out.push_back(std::move(message));
  };
  auto flush_reasoning = [&] {
    if (!pending_reasoning.empty()) assistant({{"role", "assistant"}, {"content", ""}});
  };

  for (size_t i = 0; i < input.size(); ++i) {
    const std::string path = fmt::format("input[{}]", i);
    const json& item = input[i];
    if (!item.is_object()) bad_field(path, "must be an object, got {}", json_type_name(item));
    std::string type = read_string(item, "type", path + ".type").value_or("message");
    if (type == "message") {
      check_item_keys(item, path, {"type", "role", "content", "id", "status", "phase"});
      auto role = read_string(item, "role", path + ".role");
      if (!role) bad_field(path + ".role", "is required");
      if (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer") {
        bad_field(path + ".role", "must be user, assistant, system or developer, got '{}'", *role);
      }
      std::string text = content_text(item, "content", path + ".content");
      if (*role == "assistant") {
        // Items of one assistant turn (its messages and calls, as a response's output lists
        // them) form one assistant message, as the template expects before the tool results.
        if (pending_reasoning.empty() && !out.empty() && out.back()["role"] == "assistant") {
          out.back()["content"] = out.back()["content"].get<std::string>() + text;
        } else {
          assistant({{"role", "assistant"}, {"content", std::move(text)}});
        }
      } else {
        flush_reasoning();
        out.push_back({{"role", *role}, {"content", std::move(text)}});
      }
    } else if (type == "function_call") {
      check_item_keys(item, path, {"type", "call_id", "name", "arguments", "id", "status"});
      auto call_id = read_string(item, "call_id", path + ".call_id");
      if (!call_id || call_id->empty()) bad_field(path + ".call_id", "is required");
      auto name = read_string(item, "name", path + ".name");
      if (!name || name->empty()) bad_field(path + ".name", "is required");
      auto arguments = read_string(item, "arguments", path + ".arguments");
      if (!arguments) bad_field(path + ".arguments", "is required (a JSON string)");
      // Templates iterate the arguments as a mapping, as in the chat route.
      const std::string field = path + ".arguments";
      json call = {{"id", *call_id},
                   {"type", "function"},
                   {"function",
                    {{"name", *name},
                     {"arguments", parse_client_json(*arguments, fmt::format("'{}'", field), field)}}}};
      call_ids.insert(*call_id);
      // Calls of one turn (after its message, if any) form one assistant message.
      const bool joins_last = pending_reasoning.empty() && !out.empty() &&
                              out.back()["role"] == "assistant";
      if (joins_last) {
        if (!out.back().contains("tool_calls")) out.back()["tool_calls"] = json::array();
        out.back()["tool_calls"].push_back(std::move(call));
      } else {
        assistant({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({std::move(call)})}});
      }
    } else if (type == "function_call_output") {
      check_item_keys(item, path, {"type", "call_id", "output", "id", "status"});
      auto call_id = read_string(item, "call_id", path + ".call_id");
      if (!call_id || call_id->empty()) bad_field(path + ".call_id", "is required");
      if (!call_ids.count(*call_id)) {
        bad_field(path + ".call_id",
                  "'{}' answers no function_call of this conversation (the input, or the "
                  "response named by previous_response_id)",
                  *call_id);
      }
      flush_reasoning();
      out.push_back({{"role", "tool"},
                     {"tool_call_id", *call_id},
                     {"content", content_text(item, "output", path + ".output")}});
    } else if (type == "reasoning") {
      check_item_keys(item, path, {"type", "id", "summary", "content", "encrypted_content", "status"});
      std::string text = reasoning_text(item, path);
      if (!pending_reasoning.empty() && !text.empty()) pending_reasoning += '\n';
      pending_reasoning += text;
    } else if (type == "item_reference") {
      bad_field(path + ".type",
                "'item_reference' is not supported: send the item itself, or continue a stored "
                "response with previous_response_id");
    } else {
      bad_field(path + ".type",
                "'{}' is not supported (message, function_call, function_call_output, reasoning)",
                type);
    }
  }
  flush_reasoning();
  return out;
}

nlohmann::json input_items_with_ids(const json& input) {
  nlohmann::json items = nlohmann::json::array();
  if (input.is_string()) {
    items.push_back({{"id", make_response_id("msg_")},
                     {"type", "message"},
                     {"role", "user"},
                     {"status", "completed"},
                     {"content", {{{"type", "input_text"}, {"text", input.get<std::string>()}}}}});
    return items;
  }
  for (const json& given : input) {  // already checked by input_messages
    nlohmann::json item(given);
    if (!item.contains("type")) item["type"] = "message";
    const std::string type = item["type"];
    if (type == "message" && item["content"].is_string()) {
      const bool assistant = item["role"] == "assistant";
      nlohmann::json part = {{"type", assistant ? "output_text" : "input_text"}, {"text", item["content"]}};
      if (assistant) part["annotations"] = nlohmann::json::array();
      item["content"] = nlohmann::json::array({std::move(part)});
    }
    if (!item.contains("id") || !item["id"].is_string()) {
      item["id"] = make_response_id(type == "message"                ? "msg_"
                                    : type == "function_call"        ? "fc_"
                                    : type == "function_call_output" ? "fco_"
                                                                     : "rs_");
    }
    items.push_back(std::move(item));
  }
  return items;
}

Json compose_messages(const std::optional<std::string>& instructions, const json& conversation) {
  json messages = json::array();
  if (instructions && !instructions->empty()) {
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (const json& message : conversation) messages.push_back(message);
  return messages;
}

}  // namespace m3::server
