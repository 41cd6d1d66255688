#include "server/anthropic_request.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace m3::server {
namespace {

using json = Json;

void reject_unsupported(const json& body) {
  if (const json* servers = read_array(body, "mcp_servers"); servers && !servers->empty()) {
    bad_field("mcp_servers", "is not supported: m3serve calls no MCP servers itself");
  }
  if (auto it = body.find("container"); it != body.end() && !it->is_null()) {
    bad_field("container", "is not supported: m3serve runs no code execution containers");
  }
}

void append_line(std::string& to, const std::string& text) {
  if (!to.empty()) to += '\n';
  to += text;
}

// Block i of a content array: an object with a string "type" (its path and type returned).
const json& content_block(const json& content, size_t i, std::string_view path, std::string& block_path,
                          std::string& type) {
  block_path = fmt::format("{}[{}]", path, i);
  const json& block = content[i];
  if (!block.is_object()) bad_field(block_path, "must be an object, got {}", json_type_name(block));
  auto t = read_string(block, "type", block_path + ".type");
  if (!t) bad_field(block_path + ".type", "is required");
  type = std::move(*t);
  return block;
}

// The "text" of a text block.
std::string block_text(const json& block, const std::string& block_path) {
  auto text = read_string(block, "text", block_path + ".text");
  if (!text) bad_field(block_path + ".text", "is required for a text block");
  return std::move(*text);
}

// The text of a content given as a string or as blocks of which only text is allowed.
std::string text_of_blocks(const json& content, std::string_view path, std::string_view what) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    bad_field(path, "must be a string or an array of text blocks, got {}", json_type_name(content));
  }
  std::string text;
  std::string block_path, type;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content_block(content, i, path, block_path, type);
    if (type != "text") {
      bad_field(block_path, "of type '{}' is not supported in {} (only text blocks{})", type, what,
                type == "image" || type == "document" ? "; m3serve serves text-only models" : "");
    }
    append_line(text, block_text(block, block_path));
  }
  return text;
}

// One user message: text blocks become user messages, tool_result blocks tool messages, in order.
void translate_user(const json& content, const std::string& path, json& out) {
  if (content.is_string()) {
    out.push_back({{"role", "user"}, {"content", content.get<std::string>()}});
    return;
  }
  std::string text;
  bool has_text = false;
  auto flush_text = [&] {
    if (has_text) out.push_back({{"role", "user"}, {"content", std::move(text)}});
    text.clear();
    has_text = false;
  };
  std::string block_path, type;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content_block(content, i, path, block_path, type);
    if (type == "text") {
      append_line(text, block_text(block, block_path));
      has_text = true;
    } else if (type == "tool_result") {
      flush_text();
      auto id = read_string(block, "tool_use_id", block_path + ".tool_use_id");
      if (!id || id->empty()) bad_field(block_path + ".tool_use_id", "is required for a tool_result block");
      std::string result;
      if (auto it = block.find("content"); it != block.end() && !it->is_null()) {
        result = text_of_blocks(*it, block_path + ".content", "a tool_result");
      }
      if (read_bool(block, "is_error", block_path + ".is_error").value_or(false)) {
        result = "Error: " + result;
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(result)}});
    } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      bad_field(block_path, "of type '{}' is only allowed in assistant messages", type);
    } else {
      bad_field(block_path, "of type '{}' is not supported{}", type,
                type == "image" || type == "document" ? ": m3serve serves text-only models" : "");
    }
  }
  flush_text();
}

json translate_assistant(const json& content, const std::string& path) {
  json message = {{"role", "assistant"}};
  if (content.is_string()) {
    message["content"] = content.get<std::string>();
    return message;
  }
  std::string text, reasoning;
  bool has_reasoning = false;
  json calls = json::array();
  std::string block_path, type;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content_block(content, i, path, block_path, type);
    if (type == "text") {
      text += block_text(block, block_path);  // the model's own text blocks: joined as it wrote them
    } else if (type == "thinking") {
      auto thinking = read_string(block, "thinking", block_path + ".thinking");
      if (!thinking) bad_field(block_path + ".thinking", "is required for a thinking block");
      read_string(block, "signature", block_path + ".signature");
      append_line(reasoning, *thinking);
      has_reasoning = true;
    } else if (type == "redacted_thinking") {
      continue;  // encrypted reasoning of another provider (see the header)
    } else if (type == "tool_use") {
      auto id = read_string(block, "id", block_path + ".id");
      if (!id || id->empty()) bad_field(block_path + ".id", "is required for a tool_use block");
      auto name = read_string(block, "name", block_path + ".name");
      if (!name || name->empty()) bad_field(block_path + ".name", "is required for a tool_use block");
      const json* input = read_object(block, "input", block_path + ".input");
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", input ? *input : json::object()}}}});
    } else if (type == "tool_result") {
      bad_field(block_path, "of type 'tool_result' is only allowed in user messages");
    } else {
      bad_field(block_path, "of type '{}' is not supported in assistant messages", type);
    }
  }
  message["content"] = std::move(text);
  if (has_reasoning) message["reasoning_content"] = std::move(reasoning);
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

void translate_messages(const json& body, ChatRequest& r) {
  json out = json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
    out.push_back({{"role", "system"}, {"content", text_of_blocks(*it, "system", "the system prompt")}});
  }
  const json* messages = read_array(body, "messages");
  if (!messages) bad_field("messages", "is required");
  if (messages->empty()) bad_field("messages", "must contain at least one message");
  for (size_t i = 0; i < messages->size(); ++i) {
    std::string path = fmt::format("messages[{}]", i);
    const json& message = (*messages)[i];
    if (!message.is_object()) bad_field(path, "must be an object, got {}", json_type_name(message));
    auto role = read_string(message, "role", path + ".role");
    if (!role) bad_field(path + ".role", "is required");
    auto content = message.find("content");
    if (content == message.end() || content->is_null()) bad_field(path + ".content", "is required");
    if (!content->is_string() && !content->is_array()) {
      bad_field(path + ".content", "must be a string or an array of content blocks, got {}",
                json_type_name(*content));
    }
    if (content->is_array() && content->empty()) {
      bad_field(path + ".content", "must contain at least one content block");
    }
    if (*role == "user") {
      translate_user(*content, path + ".content", out);
    } else if (*role == "assistant") {
      json assistant = translate_assistant(*content, path + ".content");
      if (i + 1 == messages->size()) {
        // A final assistant message is a prefill: the answer continues it.
        if (assistant.contains("tool_calls") || assistant["content"].get_ref<const std::string&>().empty()) {
          bad_field(path, "is the final message: a prefill must hold text (and no tool_use)");
        }
        r.add_generation_prompt = false;
        r.continue_final_message = true;
      }
      out.push_back(std::move(assistant));
    } else {
      bad_field(path + ".role", "must be 'user' or 'assistant', got '{}'{}", *role,
                *role == "system" ? " (the system prompt is the top-level 'system' field)" : "");
    }
  }
  r.messages = std::move(out);
}

json translate_tools(const json& body) {
  const json* tools = read_array(body, "tools");
  if (!tools || tools->empty()) return nullptr;
  json out = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    std::string path = fmt::format("tools[{}]", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) bad_field(path, "must be an object, got {}", json_type_name(tool));
    std::string type = read_string(tool, "type", path + ".type").value_or("custom");
    if (type != "custom") {
      bad_field(path + ".type",
                "'{}' is not supported: m3serve runs no server tools; declare client tools with "
                "name, description and input_schema",
                type);
    }
    auto name = read_string(tool, "name", path + ".name");
    if (!name || name->empty()) bad_field(path + ".name", "is required");
    for (const json& earlier : out) {
      if (earlier["function"]["name"] == *name) bad_field(path + ".name", "'{}' is declared twice", *name);
    }
    const json* schema = read_object(tool, "input_schema", path + ".input_schema");
    if (!schema) bad_field(path + ".input_schema", "is required");
    json function = {{"name", *name}};
    if (auto description = read_string(tool, "description", path + ".description")) {
      function["description"] = *description;
    }
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

void translate_tool_choice(const json& body, AnthropicRequest& a) {
  ChatRequest& r = a.chat;
  const bool has_tools = r.tools.is_array();
  r.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  const json* choice = read_object(body, "tool_choice");
  if (!choice) return;
  r.tool_choice_given = true;
  auto type = read_string(*choice, "type", "tool_choice.type");
  if (!type) bad_field("tool_choice.type", "is required");
  a.single_tool_call =
      read_bool(*choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use").value_or(false);
  if (*type == "none") {
    r.tool_choice = ToolChoice::kNone;
  } else if (*type == "auto") {
    r.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  } else if (*type == "any") {
    if (!has_tools) bad_field("tool_choice", "'any' needs a non-empty 'tools' list");
    r.tool_choice = ToolChoice::kRequired;
  } else if (*type == "tool") {
    auto name = read_string(*choice, "name", "tool_choice.name");
    if (!name) bad_field("tool_choice.name", "is required when tool_choice.type is 'tool'");
    bool found = false;
    if (has_tools) {
      for (const json& tool : r.tools) found = found || tool["function"]["name"] == *name;
    }
    if (!found) bad_field("tool_choice.name", "'{}' is not one of the given tools", *name);
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = *name;
  } else {
    bad_field("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none', got '{}'", *type);
  }
}

void translate_thinking(const json& body, AnthropicRequest& a) {
  const json* thinking = read_object(body, "thinking");
  if (!thinking) return;
  auto type = read_string(*thinking, "type", "thinking.type");
  if (!type) bad_field("thinking.type", "is required");
  if (*type != "enabled" && *type != "disabled" && *type != "adaptive") {
    bad_field("thinking.type", "must be 'enabled', 'disabled' or 'adaptive', got '{}'", *type);
  }
  a.thinking = *type;
  a.chat.chat_template_kwargs["thinking_mode"] = *type;
  auto budget = read_int(*thinking, "budget_tokens", "thinking.budget_tokens");
  if (*type == "enabled") {
    if (!budget) bad_field("thinking.budget_tokens", "is required when thinking is enabled");
    // Anthropic's floor of 1024 is its own policy; any positive budget is honoured here.
    if (*budget < 1) bad_field("thinking.budget_tokens", "must be >= 1, got {}", *budget);
    a.thinking_budget = budget;
  } else if (budget) {
    bad_field("thinking.budget_tokens", "is only allowed when thinking.type is 'enabled'");
  }
}

void parse_sampling(const json& body, SamplingRequest& s) {
  if ((s.temperature = read_number(body, "temperature"))) {
    if (*s.temperature < 0.0 || *s.temperature > 1.0) {
      bad_field("temperature", "must be in [0, 1], got {}", *s.temperature);
    }
  }
  if ((s.top_p = read_number(body, "top_p"))) {
    if (!(*s.top_p > 0.0 && *s.top_p <= 1.0)) bad_field("top_p", "must be in (0, 1], got {}", *s.top_p);
  }
  if ((s.top_k = read_int(body, "top_k"))) {
    if (*s.top_k < 0) bad_field("top_k", "must be >= 0 (0: no top-k), got {}", *s.top_k);
    if (*s.top_k > std::numeric_limits<int32_t>::max()) bad_field("top_k", "is too large: {}", *s.top_k);
  }
}

std::vector<std::string> parse_stop_sequences(const json& body, const RequestLimits& limits) {
  std::vector<std::string> stops;
  const json* list = read_array(body, "stop_sequences");
  if (!list) return stops;
  for (size_t i = 0; i < list->size(); ++i) {
    std::string path = fmt::format("stop_sequences[{}]", i);
    const std::string& stop = as_string((*list)[i], path);
    if (stop.empty()) bad_field(path, "must not be empty");
    stops.push_back(stop);
  }
  if (static_cast<int>(stops.size()) > limits.max_stop_strings) {
    bad_field("stop_sequences", "has {} strings; at most {} are allowed", stops.size(), limits.max_stop_strings);
  }
  return stops;
}

}  // namespace

AnthropicRequest parse_anthropic_request(const Json& body, const RequestLimits& limits, bool count_tokens) {
  if (!body.is_object()) bad_request("the request body must be a JSON object, got {}", json_type_name(body));
  reject_unsupported(body);
  AnthropicRequest a;
  ChatRequest& r = a.chat;
  auto model = read_string(body, "model");
  if (!model || model->empty()) bad_field("model", "is required");
  r.common.model = *model;
  translate_messages(body, r);
  r.tools = translate_tools(body);
  translate_tool_choice(body, a);
  translate_thinking(body, a);
  if (const json* metadata = read_object(body, "metadata")) {
    a.user_id = read_string(*metadata, "user_id", "metadata.user_id");
  }
  if (count_tokens) return a;

  r.common.max_tokens = read_int(body, "max_tokens");
  if (!r.common.max_tokens) bad_field("max_tokens", "is required");
  if (*r.common.max_tokens < 1) bad_field("max_tokens", "must be >= 1, got {}", *r.common.max_tokens);
  if (*r.common.max_tokens > std::numeric_limits<int32_t>::max()) {
    bad_field("max_tokens", "is too large: {}", *r.common.max_tokens);
  }
  if (a.thinking_budget && *a.thinking_budget >= *r.common.max_tokens) {
    bad_field("thinking.budget_tokens", "({}) must be less than max_tokens ({})", *a.thinking_budget,
              *r.common.max_tokens);
  }
  parse_sampling(body, r.common.sampling);
  r.common.stop = parse_stop_sequences(body, limits);
  r.common.stream = read_bool(body, "stream").value_or(false);
  return a;
}

}  // namespace m3::server
