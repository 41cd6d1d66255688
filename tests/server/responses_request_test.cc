// /v1/responses request translation: input items -> chat messages, flat tools -> chat tools,
// tool_choice / text.format / reasoning -> their chat equivalents, and the 400s naming fields.
#include "server/responses_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "tests/server/error_of.h"

namespace m3::server {
namespace {

using json = Json;

std::string param_of(const json& body) {
  return error_of([&] { parse_responses_request(body); }).param();
}

std::string input_param_of(const json& input, const json& history = json::array()) {
  return error_of([&] { input_messages(input, history); }).param();
}

// Key order is the template's business, not the translation's.
nlohmann::json unordered(const json& value) { return nlohmann::json(value); }

const json kWeather = {{"type", "function"},
                       {"name", "get_weather"},
                       {"description", "Weather of a city"},
                       {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}},
                       {"strict", true}};

TEST(ResponsesInput, StringIsOneUserMessage) {
  EXPECT_EQ(input_messages("Hello", json::array()), json::parse(R"([{"role":"user","content":"Hello"}])"));
}

TEST(ResponsesInput, ItemsBecomeChatMessages) {
  json input = json::parse(R"([
    {"role": "developer", "content": "Be terse."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"},
                                                     {"type": "input_text", "text": "Paris?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
    {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21C"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    {"role": "user", "content": "Thanks"}
  ])");
  json expected = json::parse(R"([
    {"role": "developer", "content": "Be terse."},
    {"role": "user", "content": "Weather in\nParis?"},
    {"role": "assistant", "content": "Let me check.", "reasoning_content": "I should call the tool.",
     "tool_calls": [
       {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
       {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    {"role": "user", "content": "Thanks"}
  ])");
  EXPECT_EQ(unordered(input_messages(input, json::array())), unordered(expected));
}

TEST(ResponsesInput, ReasoningBeforeACallStartsItsOwnTurnAndSummaryStandsInForContent) {
  json input = json::parse(R"([
    {"role": "user", "content": "Go"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan"}], "encrypted_content": null},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
  ])");
  json out = input_messages(input, json::array());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1]["reasoning_content"], "Plan");
  EXPECT_EQ(out[1]["tool_calls"][0]["function"]["arguments"], json::object());
}

TEST(ResponsesInput, AResponsesOutputSentBackIsOneAssistantTurn) {
  // A response's output (reasoning, a call, the text that came with it) then the call's result.
  json input = json::parse(R"([
    {"role": "user", "content": "Go"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "R"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Calling.", "annotations": [], "logprobs": []}]},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"}
  ])");
  json expected = json::parse(R"([
    {"role": "user", "content": "Go"},
    {"role": "assistant", "content": "Calling.", "reasoning_content": "R",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}
  ])");
  EXPECT_EQ(unordered(input_messages(input, json::array())), unordered(expected));
}

TEST(ResponsesInput, OutputsMustAnswerACallOfTheConversation) {
  json output = json::parse(R"([{"type": "function_call_output", "call_id": "call_9", "output": "x"}])");
  EXPECT_EQ(input_param_of(output), "input[0].call_id");
  // A call of the previous response's conversation counts.
  json history = json::parse(R"([{"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": {}}}]}])");
  json out = input_messages(output, history);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["role"], "tool");
  EXPECT_EQ(out[0]["tool_call_id"], "call_9");
}

TEST(ResponsesInput, BadItemsNameTheirField) {
  EXPECT_EQ(input_param_of(json::parse(R"([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])")),
            "input[0].content[0]");
  EXPECT_EQ(input_param_of(json::parse(R"([{"role": "tool", "content": "x"}])")), "input[0].role");
  EXPECT_EQ(input_param_of(json::parse(R"([{"role": "user"}])")), "input[0].content");
  EXPECT_EQ(input_param_of(json::parse(R"(["hi"])")), "input[0]");
  EXPECT_EQ(input_param_of(json::parse(R"([{"type": "item_reference", "id": "msg_1"}])")), "input[0].type");
  EXPECT_EQ(input_param_of(json::parse(R"([{"type": "web_search_call", "id": "ws_1"}])")), "input[0].type");
  EXPECT_EQ(input_param_of(json::parse(R"([{"type": "function_call", "call_id": "c", "name": "f",
                                            "arguments": "{not json"}])")),
            "input[0].arguments");
  EXPECT_EQ(input_param_of(json::parse(R"([{"type": "function_call", "call_id": "c", "arguments": "{}"}])")),
            "input[0].name");
  EXPECT_EQ(input_param_of(json::parse(R"([{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}])")),
            "input[0].encrypted_content");
  EXPECT_EQ(input_param_of(json::parse(R"([{"role": "user", "content": "x", "attachments": []}])")),
            "input[0].attachments");
}

TEST(ResponsesRequest, FieldsMapOntoTheChatRequest) {
  json body = {{"model", "m"},
               {"input", "hi"},
               {"instructions", "Be brief."},
               {"max_output_tokens", 64},
               {"temperature", 0.5},
               {"top_p", 0.9},
               {"stream", true},
               {"tools", {kWeather}},
               {"tool_choice", "required"},
               {"parallel_tool_calls", false},
               {"store", false},
               {"previous_response_id", "resp_1"},
               {"metadata", {{"k", "v"}}},
               {"include", {"reasoning.encrypted_content"}},
               {"prompt_cache_key", "abc"},
               {"reasoning", {{"effort", "high"}, {"summary", "auto"}}},
               {"text", {{"format", {{"type", "json_schema"}, {"name", "out"}, {"schema", {{"type", "object"}}}}}}}};
  ResponsesRequest r = parse_responses_request(body);
  EXPECT_EQ(r.chat.common.model, "m");
  EXPECT_EQ(r.chat.common.max_tokens, 64);
  EXPECT_EQ(r.chat.common.sampling.temperature, 0.5);
  EXPECT_EQ(r.chat.common.sampling.top_p, 0.9);
  EXPECT_TRUE(r.chat.common.stream);
  EXPECT_EQ(r.chat.common.n, 1);
  EXPECT_EQ(r.instructions, "Be brief.");
  EXPECT_EQ(r.previous_response_id, "resp_1");
  EXPECT_FALSE(r.store);
  EXPECT_EQ(r.tool_call_limit(), 1);
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0], json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": true}})"));
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(r.chat.response_format, "json_schema");
  EXPECT_EQ(r.chat.response_schema, json({{"type", "object"}}));
  EXPECT_EQ(r.chat.reasoning_effort, "high");
  EXPECT_EQ(r.chat.chat_template_kwargs["thinking_mode"], "enabled");
  EXPECT_EQ(r.reasoning, nlohmann::json({{"effort", "high"}, {"summary", "auto"}}));
  EXPECT_EQ(r.tools, nlohmann::json::array({nlohmann::json(kWeather)}));

  EXPECT_EQ(compose_messages(r.instructions, input_messages(r.input, json::array())),
            json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])"));
}

TEST(ResponsesRequest, Defaults) {
  ResponsesRequest r = parse_responses_request({{"input", "hi"}});
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.chat.common.stream);
  EXPECT_FALSE(r.chat.common.max_tokens);
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::kNone);
  EXPECT_EQ(r.tool_call_limit(), -1);
  EXPECT_EQ(r.chat.response_format, "text");
  EXPECT_FALSE(r.chat.reasoning_effort);
  EXPECT_FALSE(r.chat.chat_template_kwargs.contains("thinking_mode"));  // the template's default
  ResponsesRequest with_tools = parse_responses_request({{"input", "hi"}, {"tools", {kWeather}}});
  EXPECT_EQ(with_tools.chat.tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(with_tools.tool_choice, "auto");
}

TEST(ResponsesRequest, ToolChoiceForms) {
  json base = {{"input", "hi"}, {"tools", {kWeather}}};
  auto with = [&](json choice) {
    json body = base;
    body["tool_choice"] = std::move(choice);
    return body;
  };
  EXPECT_EQ(parse_responses_request(with("none")).chat.tool_choice, ToolChoice::kNone);
  EXPECT_EQ(parse_responses_request(with("auto")).chat.tool_choice, ToolChoice::kAuto);
  ResponsesRequest named = parse_responses_request(with({{"type", "function"}, {"name", "get_weather"}}));
  EXPECT_EQ(named.chat.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.chat.tool_choice_name, "get_weather");
  EXPECT_EQ(param_of(with({{"type", "function"}, {"name", "nope"}})), "tool_choice.name");
  EXPECT_EQ(param_of(with({{"type", "function"}})), "tool_choice.name");
  EXPECT_EQ(param_of(with({{"type", "web_search_preview"}})), "tool_choice.type");
  EXPECT_EQ(param_of(with({{"type", "allowed_tools"}, {"mode", "auto"}, {"tools", json::array()}})),
            "tool_choice.type");
  EXPECT_EQ(param_of(with("sometimes")), "tool_choice");
  EXPECT_EQ(param_of({{"input", "hi"}, {"tool_choice", "required"}}), "tool_choice");
}

TEST(ResponsesRequest, ToolLimits) {
  EXPECT_EQ(parse_responses_request({{"input", "x"}, {"max_tool_calls", 3}}).tool_call_limit(), 3);
  EXPECT_EQ(parse_responses_request({{"input", "x"}, {"max_tool_calls", 3}, {"parallel_tool_calls", false}})
                .tool_call_limit(),
            1);
  EXPECT_EQ(param_of({{"input", "x"}, {"max_tool_calls", 0}}), "max_tool_calls");
}

TEST(ResponsesRequest, ReasoningEffortNoneTurnsThinkingOff) {
  ResponsesRequest r = parse_responses_request({{"input", "x"}, {"reasoning", {{"effort", "none"}}}});
  EXPECT_EQ(r.chat.chat_template_kwargs["thinking_mode"], "disabled");
  EXPECT_EQ(r.chat.reasoning_effort, "none");
  EXPECT_EQ(param_of({{"input", "x"}, {"reasoning", {{"effort", "max"}}}}), "reasoning.effort");
  EXPECT_EQ(param_of({{"input", "x"}, {"reasoning", {{"summary", "short"}}}}), "reasoning.summary");
  EXPECT_EQ(param_of({{"input", "x"}, {"reasoning", {{"budget", 5}}}}), "reasoning.budget");
}

TEST(ResponsesRequest, OutputLogprobsOnlyWhenIncluded) {
  const ResponsesRequest asked = parse_responses_request(
      {{"input", "x"}, {"top_logprobs", 3}, {"include", {"reasoning.encrypted_content", "message.output_text.logprobs"}}});
  EXPECT_TRUE(asked.output_logprobs);
  EXPECT_EQ(asked.top_logprobs, 3);
  EXPECT_EQ(asked.chat.common.logprobs, 3);
  EXPECT_EQ(asked.chat.top_logprobs, 3);
  const ResponsesRequest bare = parse_responses_request({{"input", "x"}, {"include", {"message.output_text.logprobs"}}});
  EXPECT_TRUE(bare.output_logprobs);
  EXPECT_EQ(bare.chat.common.logprobs, 0);  // the tokens' own logprobs, no alternatives
  const ResponsesRequest not_included = parse_responses_request({{"input", "x"}, {"top_logprobs", 3}});
  EXPECT_FALSE(not_included.output_logprobs);
  EXPECT_EQ(not_included.top_logprobs, 3);  // echoed
  EXPECT_EQ(not_included.chat.common.logprobs, -1);
  RequestLimits limits;
  limits.max_logprobs = 5;
  EXPECT_THROW(parse_responses_request({{"input", "x"}, {"top_logprobs", 6}}, limits), ApiError);
}

TEST(ResponsesRequest, UnsupportedAndBadFieldsAreNamed) {
  EXPECT_EQ(param_of({{"input", "x"}, {"frobnicate", true}}), "frobnicate");
  EXPECT_EQ(param_of({{"input", "x"}, {"messages", json::array()}}), "messages");
  EXPECT_EQ(param_of({{"input", "x"}, {"stop", "x"}}), "stop");
  EXPECT_EQ(param_of({{"input", "x"}, {"background", true}, {"store", false}}), "background");
  EXPECT_EQ(param_of({{"input", "x"}, {"background", true}, {"stream", true}}), "stream");
  EXPECT_TRUE(parse_responses_request({{"input", "x"}, {"background", true}}).background);
  EXPECT_EQ(param_of({{"input", "x"}, {"conversation", "conv_1"}}), "conversation");
  EXPECT_EQ(param_of({{"input", "x"}, {"prompt", {{"id", "p"}}}}), "prompt");
  EXPECT_EQ(param_of({{"input", "x"}, {"truncation", "auto"}}), "truncation");
  EXPECT_EQ(param_of({{"input", "x"}, {"top_logprobs", 21}}), "top_logprobs");
  EXPECT_EQ(param_of({{"input", "x"}, {"top_logprobs", -1}}), "top_logprobs");
  EXPECT_EQ(param_of({{"input", "x"}, {"include", {"file_search_call.results"}}}), "include[0]");
  EXPECT_EQ(param_of({{"input", "x"}, {"max_output_tokens", 0}}), "max_output_tokens");
  EXPECT_EQ(param_of({{"input", "x"}, {"temperature", -1}}), "temperature");
  EXPECT_EQ(param_of({{"input", "x"}, {"top_p", 0}}), "top_p");
  EXPECT_EQ(param_of({{"input", "x"}, {"stream_options", {{"include_obfuscation", false}}}}), "stream_options");
  EXPECT_EQ(param_of({{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}}}}}}),
            "text.format.schema");
  EXPECT_EQ(param_of({{"input", "x"}, {"text", {{"format", {{"type", "grammar"}}}}}}), "text.format.type");
  EXPECT_EQ(param_of({{"input", "x"}, {"metadata", {{"k", 1}}}}), "metadata.k");
  EXPECT_EQ(param_of(json::object()), "input");
  EXPECT_EQ(param_of({{"input", json::array()}}), "input");
  EXPECT_EQ(param_of({{"input", 5}}), "input");
  EXPECT_EQ(param_of({{"input", "x"}, {"previous_response_id", ""}}), "previous_response_id");
}

TEST(ResponsesRequest, ToolsMustBeFlatFunctions) {
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}), "tools[0].type");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {kWeather, {{"type", "file_search"}, {"vector_store_ids", {"v"}}}}}}),
            "tools[1].type");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "code_interpreter"}}}}}), "tools[0].type");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "computer_use_preview"}}}}}), "tools[0].type");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}),
            "tools[0].function");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "function"}}}}}), "tools[0].name");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {kWeather, kWeather}}}), "tools[1].name");
  EXPECT_EQ(param_of({{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", "x"}}}}}),
            "tools[0].parameters");
  const ApiError hosted = error_of([] {
    parse_responses_request({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}});
  });
  EXPECT_NE(std::string(hosted.what()).find("web_search"), std::string::npos);
  EXPECT_EQ(hosted.status(), 400);
}

}  // namespace
}  // namespace m3::server
