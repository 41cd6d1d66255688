// The Anthropic Messages API pieces without sockets: request translation into the chat request
// (messages, tools, tool choice, thinking, sampling), field errors, the error shape per status,
// stop reasons and usage, and the content blocks / stream events built from choice deltas.
#include <gtest/gtest.h>

#include <sstream>

#include "server/anthropic_error.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/api_error.h"
#include "tests/server/error_of.h"

namespace m3::server {
namespace {

using json = Json;

const RequestLimits kLimits;

json body(json extra = json::object()) {
  json b = {{"model", "m"}, {"max_tokens", 64}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  for (auto& [key, value] : extra.items()) b[key] = value;
  return b;
}

json weather_tool() {
  return {{"name", "get_weather"},
          {"description", "Weather"},
          {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
}

TEST(AnthropicRequest, TranslatesAMultiTurnToolExchange) {
  json b = body({{"system", json::array({{{"type", "text"}, {"text", "Be brief."}},
                                         {{"type", "text"}, {"text", "Use tools."}, {"cache_control", {{"type", "ephemeral"}}}}})},
                 {"tools", json::array({weather_tool()})},
                 {"messages",
                  json::array(
                      {{{"role", "user"}, {"content", "Weather in Paris?"}},
                       {{"role", "assistant"},
                        {"content", json::array({{{"type", "thinking"}, {"thinking", "Need the tool."}, {"signature", "s"}},
                                                 {{"type", "redacted_thinking"}, {"data", "opaque"}},
                                                 {{"type", "text"}, {"text", "Checking."}},
                                                 {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"},
                                                  {"input", {{"city", "Paris"}}}}})}},
                       {{"role", "user"},
                        {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "Sunny"}},
                                                 {{"type", "tool_result"}, {"tool_use_id", "toolu_2"}, {"is_error", true},
                                                  {"content", json::array({{{"type", "text"}, {"text", "timeout"}}})}},
                                                 {{"type", "text"}, {"text", "And tomorrow?"}}})}}})}});
  AnthropicRequest a = parse_anthropic_request(b, kLimits);
  const json& m = a.chat.messages;
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], (json{{"role", "system"}, {"content", "Be brief.\nUse tools."}}));
  EXPECT_EQ(m[1], (json{{"role", "user"}, {"content", "Weather in Paris?"}}));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "Need the tool.");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], (json{{"city", "Paris"}}));
  EXPECT_EQ(m[3], (json{{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "Sunny"}}));
  EXPECT_EQ(m[4], (json{{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "Error: timeout"}}));
  EXPECT_EQ(m[5], (json{{"role", "user"}, {"content", "And tomorrow?"}}));

  ASSERT_TRUE(a.chat.tools.is_array());
  EXPECT_EQ(a.chat.tools[0]["type"], "function");
  EXPECT_EQ(a.chat.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(a.chat.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(a.chat.tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(a.chat.common.max_tokens, 64);
  EXPECT_TRUE(a.chat.add_generation_prompt);
  EXPECT_FALSE(a.chat.continue_final_message);
}

TEST(AnthropicRequest, ToolChoiceMapsOntoTheChatToolChoice) {
  auto with_choice = [](json choice) {
    return parse_anthropic_request(body({{"tools", json::array({weather_tool()})}, {"tool_choice", choice}}), kLimits);
  };
  EXPECT_EQ(with_choice({{"type", "auto"}}).chat.tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(with_choice({{"type", "none"}}).chat.tool_choice, ToolChoice::kNone);
  AnthropicRequest any = with_choice({{"type", "any"}, {"disable_parallel_tool_use", true}});
  EXPECT_EQ(any.chat.tool_choice, ToolChoice::kRequired);
  EXPECT_TRUE(any.single_tool_call);
  AnthropicRequest named = with_choice({{"type", "tool"}, {"name", "get_weather"}});
  EXPECT_EQ(named.chat.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.chat.tool_choice_name, "get_weather");
  EXPECT_FALSE(named.single_tool_call);

  EXPECT_EQ(error_of([&] { with_choice({{"type", "tool"}, {"name", "other"}}); }).param(), "tool_choice.name");
  EXPECT_EQ(error_of([&] { with_choice({{"type", "tool"}}); }).param(), "tool_choice.name");
  EXPECT_EQ(error_of([&] { with_choice({{"type", "sometimes"}}); }).param(), "tool_choice.type");
  EXPECT_EQ(error_of([] { parse_anthropic_request(body({{"tool_choice", {{"type", "any"}}}}), kLimits); }).param(),
            "tool_choice");
  // No tools: nothing to choose.
  EXPECT_EQ(parse_anthropic_request(body(), kLimits).chat.tool_choice, ToolChoice::kNone);
}

TEST(AnthropicRequest, ThinkingSamplingStopsAndPrefill) {
  AnthropicRequest on = parse_anthropic_request(
      body({{"thinking", {{"type", "enabled"}, {"budget_tokens", 20}}},
            {"temperature", 0.5},
            {"top_p", 0.9},
            {"top_k", 40},
            {"stop_sequences", {"END", "STOP"}},
            {"stream", true},
            {"metadata", {{"user_id", "u-1"}}}}),
      kLimits);
  EXPECT_EQ(on.thinking, "enabled");
  EXPECT_EQ(on.thinking_budget, 20);
  EXPECT_EQ(on.chat.chat_template_kwargs["thinking_mode"], "enabled");
  EXPECT_EQ(on.chat.common.sampling.temperature, 0.5);
  EXPECT_EQ(on.chat.common.sampling.top_p, 0.9);
  EXPECT_EQ(on.chat.common.sampling.top_k, 40);
  EXPECT_EQ(on.chat.common.stop, (std::vector<std::string>{"END", "STOP"}));
  EXPECT_TRUE(on.chat.common.stream);
  EXPECT_EQ(on.user_id, "u-1");

  AnthropicRequest off = parse_anthropic_request(body({{"thinking", {{"type", "disabled"}}}}), kLimits);
  EXPECT_EQ(off.chat.chat_template_kwargs["thinking_mode"], "disabled");
  EXPECT_FALSE(off.thinking_budget);
  EXPECT_FALSE(parse_anthropic_request(body(), kLimits).chat.chat_template_kwargs.contains("thinking_mode"));

  AnthropicRequest prefill = parse_anthropic_request(
      body({{"messages", json::array({{{"role", "user"}, {"content", "Count"}}, {{"role", "assistant"}, {"content", "1, 2,"}}})}}),
      kLimits);
  EXPECT_FALSE(prefill.chat.add_generation_prompt);
  EXPECT_TRUE(prefill.chat.continue_final_message);

  // count_tokens needs no max_tokens.
  json counted = body();
  counted.erase("max_tokens");
  EXPECT_FALSE(parse_anthropic_request(counted, kLimits, true).chat.common.max_tokens);
}

TEST(AnthropicRequest, BadFieldsAreNamed) {
  auto param_of = [](json b) { return error_of([&] { parse_anthropic_request(b, kLimits); }).param(); };
  json no_max = body();
  no_max.erase("max_tokens");
  EXPECT_EQ(param_of(no_max), "max_tokens");
  json no_model = body();
  no_model.erase("model");
  EXPECT_EQ(param_of(no_model), "model");
  EXPECT_EQ(param_of(body({{"max_tokens", 0}})), "max_tokens");
  EXPECT_EQ(param_of(body({{"temperature", 1.5}})), "temperature");
  EXPECT_EQ(param_of(body({{"top_p", 0}})), "top_p");
  EXPECT_EQ(param_of(body({{"top_k", -1}})), "top_k");
  EXPECT_EQ(param_of(body({{"stop_sequences", {""}}})), "stop_sequences[0]");
  EXPECT_EQ(param_of(body({{"thinking", {{"type", "enabled"}}}})), "thinking.budget_tokens");
  EXPECT_EQ(param_of(body({{"thinking", {{"type", "enabled"}, {"budget_tokens", 64}}}})), "thinking.budget_tokens");
  EXPECT_EQ(param_of(body({{"thinking", {{"type", "disabled"}, {"budget_tokens", 8}}}})), "thinking.budget_tokens");
  EXPECT_EQ(param_of(body({{"thinking", {{"type", "maybe"}}}})), "thinking.type");
  EXPECT_EQ(param_of(body({{"messages", json::array()}})), "messages");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "system"}, {"content", "x"}}})}})), "messages[0].role");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"}}})}})), "messages[0].content");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"}, {"content", json::array()}}})}})),
            "messages[0].content");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"},
                                                       {"content", json::array({{{"type", "image"}, {"source", json::object()}}})}}})}})),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"},
                                                       {"content", json::array({{{"type", "tool_use"}, {"id", "x"}}})}}})}})),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"},
                                                       {"content", json::array({{{"type", "tool_result"}}})}}})}})),
            "messages[0].content[0].tool_use_id");
  EXPECT_EQ(param_of(body({{"messages", json::array({{{"role", "user"}, {"content", "a"}},
                                                      {{"role", "assistant"}, {"content", ""}}})}})),
            "messages[1]");
  EXPECT_EQ(param_of(body({{"tools", json::array({{{"name", "t"}}})}})), "tools[0].input_schema");
  EXPECT_EQ(param_of(body({{"tools", json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}})}})),
            "tools[0].type");
  EXPECT_EQ(param_of(body({{"tools", json::array({weather_tool(), weather_tool()})}})), "tools[1].name");
  EXPECT_EQ(param_of(body({{"system", 5}})), "system");
  EXPECT_EQ(param_of(body({{"mcp_servers", json::array({{{"url", "x"}}})}})), "mcp_servers");
  EXPECT_EQ(param_of(body({{"metadata", {{"user_id", 5}}}})), "metadata.user_id");
}

TEST(AnthropicError, ShapeAndTypePerStatus) {
  nlohmann::json e = anthropic_error_json(400, "'max_tokens' is required", "max_tokens");
  EXPECT_EQ(e, (nlohmann::json{{"type", "error"},
                     {"error", {{"type", "invalid_request_error"}, {"message", "'max_tokens' is required"}}}}));
  EXPECT_EQ(anthropic_error_json(400, "must be a string", "top_k")["error"]["message"], "top_k: must be a string");
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(403), "permission_error");
  EXPECT_EQ(anthropic_error_type(404), "not_found_error");
  EXPECT_EQ(anthropic_error_type(405), "invalid_request_error");
  EXPECT_EQ(anthropic_error_type(413), "request_too_large");
  EXPECT_EQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(529), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(504), "timeout_error");
}

TEST(AnthropicResponse, StopReasonsUsageAndIds) {
  EXPECT_EQ(anthropic_stop({"stop", nullptr}).reason, "end_turn");
  AnthropicStop seq = anthropic_stop({"stop", "END"});
  EXPECT_EQ(seq.reason, "stop_sequence");
  EXPECT_EQ(seq.sequence, "END");
  EXPECT_EQ(anthropic_stop({"length", nullptr}).reason, "max_tokens");
  EXPECT_EQ(anthropic_stop({"tool_calls", nullptr}).reason, "tool_use");
  EXPECT_TRUE(anthropic_stop({"abort", nullptr}).reason.empty());
  EXPECT_EQ(anthropic_usage(100, 64, 7), (nlohmann::json{{"input_tokens", 36},
                                                          {"cache_creation_input_tokens", 0},
                                                          {"cache_read_input_tokens", 64},
                                                          {"output_tokens", 7}}));
  auto ids = anthropic_tool_use_ids();
  std::string a = ids(), b = ids();
  EXPECT_TRUE(a.starts_with("toolu_")) << a;
  EXPECT_EQ(a.size(), 6u + 24u);
  EXPECT_NE(a, b);
}

// (event type, data) pairs of an SSE text.
std::vector<std::pair<std::string, nlohmann::json>> events_of(const std::string& sse) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  std::istringstream in(sse);
  std::string line, type;
  while (std::getline(in, line)) {
    if (line.starts_with("event: ")) type = line.substr(7);
    if (line.starts_with("data: ")) {
      nlohmann::json data = nlohmann::json::parse(line.substr(6));
      EXPECT_EQ(data["type"], type);
      out.emplace_back(type, std::move(data));
    }
  }
  return out;
}

TEST(AnthropicContent, BlocksAndEventsFollowTheOutput) {
  AnthropicContent content;
  std::string sse;
  sse += content.add({.content = "", .reasoning = "Let me ", .tool_calls = {}});
  sse += content.add({.content = "", .reasoning = "think.", .tool_calls = {}});
  sse += content.add({.content = "Sure.", .reasoning = "", .tool_calls = {}});
  // Text, then a call opening in the same step: the text comes first.
  sse += content.add({.content = " Calling.", .reasoning = "",
                      .tool_calls = {{.index = 0, .id = "toolu_a", .name = "f", .arguments_delta = "{\"x\":"}}});
  // Text while the call is open is held until the call's block ends.
  sse += content.add({.content = "stray", .reasoning = "", .tool_calls = {{.index = 0, .id = std::nullopt, .name = std::nullopt, .arguments_delta = "1}"}}});
  sse += content.add({.content = "", .reasoning = "",
                      .tool_calls = {{.index = 1, .id = "toolu_b", .name = "g", .arguments_delta = "{}"}}});
  sse += content.close();

  const nlohmann::json& blocks = content.blocks();
  ASSERT_EQ(blocks.size(), 5u) << blocks.dump();
  EXPECT_EQ(blocks[0], (nlohmann::json{{"type", "thinking"}, {"thinking", "Let me think."}, {"signature", ""}}));
  EXPECT_EQ(blocks[1], (nlohmann::json{{"type", "text"}, {"text", "Sure. Calling."}}));
  EXPECT_EQ(blocks[2], (nlohmann::json{{"type", "tool_use"}, {"id", "toolu_a"}, {"name", "f"}, {"input", {{"x", 1}}}}));
  EXPECT_EQ(blocks[3], (nlohmann::json{{"type", "text"}, {"text", "stray"}}));
  EXPECT_EQ(blocks[4], (nlohmann::json{{"type", "tool_use"}, {"id", "toolu_b"}, {"name", "g"}, {"input", nlohmann::json::object()}}));

  // The events rebuild the same blocks, each opened, filled and closed in index order.
  nlohmann::json rebuilt = nlohmann::json::array();
  std::vector<std::string> inputs;
  int open = -1;
  for (auto& [type, data] : events_of(sse)) {
    if (type == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = data["index"];
      EXPECT_EQ(open, static_cast<int>(rebuilt.size()));
      rebuilt.push_back(data["content_block"]);
      inputs.emplace_back();
    } else if (type == "content_block_delta") {
      ASSERT_EQ(data["index"], open);
      nlohmann::json& block = rebuilt[open];
      const nlohmann::json& d = data["delta"];
      if (d["type"] == "thinking_delta") block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      else if (d["type"] == "text_delta") block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      else if (d["type"] == "input_json_delta") inputs[open] += d["partial_json"].get<std::string>();
      else ADD_FAILURE() << d.dump();
    } else if (type == "content_block_stop") {
      ASSERT_EQ(data["index"], open);
      if (rebuilt[open]["type"] == "tool_use") {
        rebuilt[open]["input"] = inputs[open].empty() ? nlohmann::json::object() : nlohmann::json::parse(inputs[open]);
      }
      open = -1;
    } else {
      ADD_FAILURE() << type;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(rebuilt, blocks);
}

}  // namespace
}  // namespace m3::server
