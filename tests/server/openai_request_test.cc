#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "tests/server/error_of.h"

namespace m3::server {
namespace {

using json = Json;

const RequestLimits kLimits;

TEST(CompletionRequest, ParsesPromptForms) {
  auto text = parse_completion_request(json{{"prompt", "hi"}}, kLimits);
  ASSERT_EQ(text.prompts.size(), 1u);
  EXPECT_FALSE(text.prompts[0].is_token_ids);
  EXPECT_EQ(text.prompts[0].text, "hi");
  EXPECT_EQ(text.common.max_tokens, 16);  // OpenAI's completions default

  auto batch = parse_completion_request(json{{"prompt", {"a", "b"}}}, kLimits);
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(batch.prompts[1].text, "b");

  auto ids = parse_completion_request(json{{"prompt", {1, 2, 3}}}, kLimits);
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_token_ids);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));

  auto id_batch = parse_completion_request(json{{"prompt", {{1, 2}, {3}}}}, kLimits);
  ASSERT_EQ(id_batch.prompts.size(), 2u);
  EXPECT_EQ(id_batch.prompts[1].token_ids, (std::vector<int32_t>{3}));
}

TEST(CompletionRequest, RejectsBadPrompts) {
  EXPECT_EQ(error_of([] { parse_completion_request(json::object(), kLimits); }).param(), "prompt");
  EXPECT_EQ(error_of([] {
              parse_completion_request(json{{"prompt", 5}}, kLimits);
            }).param(),
            "prompt");
  EXPECT_EQ(error_of([] {
              parse_completion_request(json{{"prompt", json::array()}}, kLimits);
            }).param(),
            "prompt");
  EXPECT_EQ(error_of([] {
              parse_completion_request(json{{"prompt", {"a", 1}}}, kLimits);
            }).param(),
            "prompt[1]");
  EXPECT_EQ(error_of([] {
              parse_completion_request(json{{"prompt", {1, -2}}}, kLimits);
            }).param(),
            "prompt[1]");
  EXPECT_EQ(error_of([] { parse_completion_request(json::array(), kLimits); }).status(), 400);
}

TEST(CompletionRequest, ValidatesSamplingRanges) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"temperature", -0.5}}, "temperature"},
      {{{"prompt", "x"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "x"}, {"top_p", 0.0}}, "top_p"},
      {{{"prompt", "x"}, {"top_p", 1.5}}, "top_p"},
      {{{"prompt", "x"}, {"top_k", -2}}, "top_k"},
      {{{"prompt", "x"}, {"top_k", 1.5}}, "top_k"},
      {{{"prompt", "x"}, {"min_p", 2}}, "min_p"},
      {{{"prompt", "x"}, {"presence_penalty", 3}}, "presence_penalty"},
      {{{"prompt", "x"}, {"frequency_penalty", -2.5}}, "frequency_penalty"},
      {{{"prompt", "x"}, {"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"prompt", "x"}, {"n", 0}}, "n"},
      {{{"prompt", "x"}, {"n", 100000}}, "n"},
      {{{"prompt", "x"}, {"max_tokens", -1}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", "many"}}, "max_tokens"},
      {{{"prompt", "x"}, {"logprobs", 21}}, "logprobs"},
      {{{"prompt", "x"}, {"logprobs", true}}, "logprobs"},
      {{{"prompt", "x"}, {"stop", {"ok", ""}}}, "stop"},
      {{{"prompt", "x"}, {"stop", 3}}, "stop"},
      {{{"prompt", "x"}, {"stop_token_ids", {1, "a"}}}, "stop_token_ids[1]"},
      {{{"prompt", "x"}, {"stream", "yes"}}, "stream"},
      {{{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}},
       "stream_options.include_usage"},
      {{{"prompt", "x"}, {"suffix", "tail"}}, "suffix"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", 101}}}}, "logit_bias.5"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", "high"}}}}, "logit_bias.5"},
      {{{"prompt", "x"}, {"logit_bias", {{"five", 1}}}}, "logit_bias.five"},
      {{{"prompt", "x"}, {"logit_bias", {{"-1", 1}}}}, "logit_bias.-1"},
      {{{"prompt", "x"}, {"logit_bias", {{"1e3", 1}}}}, "logit_bias.1e3"},
      {{{"prompt", "x"}, {"logit_bias", {5, 1}}}, "logit_bias"},
      {{{"prompt", "x"}, {"best_of", 3}}, "best_of"},
      {{{"prompt", "x"}, {"min_tokens", 20}, {"max_tokens", 10}}, "min_tokens"},
  };
  for (const Case& c : cases) {
    ApiError e = error_of([&] { parse_completion_request(c.body, kLimits); });
    EXPECT_EQ(e.status(), 400) << c.body.dump();
    EXPECT_EQ(e.param(), c.param) << c.body.dump() << " -> " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.param.substr(0, c.param.find('['))), std::string::npos)
        << "message should name the field: " << e.what();
  }
}

TEST(CompletionRequest, AcceptsNullsAsAbsentAndReadsOptions) {
  json body = {{"prompt", "x"},
               {"temperature", nullptr},
               {"max_tokens", 5},
               {"stop", "\n"},
               {"seed", 7},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"logprobs", 3},
               {"echo", true},
               {"top_k", -1},
               {"ignore_eos", true},
               {"prompt_logprobs", 2},
               {"stop_token_ids", {9}},
               {"logit_bias", {{"7", 10}, {"3", -5.5}, {"12", -100}}}};
  auto r = parse_completion_request(body, kLimits);
  EXPECT_EQ(r.common.sampling.logit_bias,
            (std::vector<std::pair<int32_t, double>>{{3, -5.5}, {7, 10.0}, {12, -100.0}}));  // by id
  EXPECT_FALSE(r.common.sampling.temperature);
  EXPECT_EQ(r.common.max_tokens, 5);
  EXPECT_EQ(r.common.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.common.sampling.seed, 7u);
  EXPECT_TRUE(r.common.stream);
  EXPECT_TRUE(r.common.include_usage);
  EXPECT_EQ(r.common.logprobs, 3);
  EXPECT_EQ(r.common.prompt_logprobs, 2);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.common.ignore_eos);
  EXPECT_EQ(r.common.stop_token_ids, std::vector<int32_t>{9});
  // max_tokens 0 is allowed with echo (scoring the prompt only).
  EXPECT_EQ(
      parse_completion_request(json{{"prompt", "x"}, {"echo", true}, {"max_tokens", 0}}, kLimits)
          .common.max_tokens,
      0);
}

TEST(ChatRequest, NormalizesMessages) {
  json body = {
      {"model", "m"},
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}},
        {{"role", "user"},
         {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"reasoning", "thinking"},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}}},
      {"max_completion_tokens", 9},
      {"max_tokens", 100}};
  auto r = parse_chat_request(body, kLimits);
  EXPECT_EQ(r.common.model, "m");
  EXPECT_EQ(r.common.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], (json{{"x", 1}}));
  EXPECT_EQ(r.messages[2]["reasoning_content"], "thinking");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNone);
  EXPECT_EQ(r.common.logprobs, -1);
}

TEST(ChatRequest, RejectsBadMessagesNamingTheField) {
  struct Case {
    json messages;
    std::string param;
  };
  const std::vector<Case> cases = {
      {json::array(), "messages"},
      {json("hello"), "messages"},
      {json{{{"content", "x"}}}, "messages[0].role"},
      {json{{{"role", "user"}}}, "messages[0].content"},
      {json{{{"role", "user"}, {"content", 5}}}, "messages[0].content"},
      {json{{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}},
       "messages[0].content[0]"},
      {json{{{"role", "user"}, {"content", "x"}},
            {{"role", "assistant"},
             {"content", "y"},
             {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", "{oops"}}}}}}}},
       "messages[1].tool_calls[0].function.arguments"},
  };
  for (const Case& c : cases) {
    ApiError e = error_of([&] { parse_chat_request(json{{"messages", c.messages}}, kLimits); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), c.param) << e.what();
  }
}

TEST(ChatRequest, ToolsAndToolChoice) {
  json tools = {{{"type", "function"},
                 {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}};
  json messages = {{{"role", "user"}, {"content", "hi"}}};
  auto automatic = parse_chat_request(json{{"messages", messages}, {"tools", tools}}, kLimits);
  EXPECT_EQ(automatic.tool_choice, ToolChoice::kAuto);
  auto none = parse_chat_request(
      json{{"messages", messages}, {"tools", tools}, {"tool_choice", "none"}}, kLimits);
  EXPECT_EQ(none.tool_choice, ToolChoice::kNone);
  auto named = parse_chat_request(
      json{{"messages", messages},
           {"tools", tools},
           {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
      kLimits);
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "get_weather");

  EXPECT_EQ(error_of([&] {
              parse_chat_request(json{{"messages", messages},
                                      {"tools", tools},
                                      {"tool_choice", {{"function", {{"name", "nope"}}}}}},
                                 kLimits);
            }).param(),
            "tool_choice.function.name");
  EXPECT_EQ(
      error_of([&] {
        parse_chat_request(json{{"messages", messages}, {"tool_choice", "required"}}, kLimits);
      }).param(),
      "tool_choice");
  EXPECT_EQ(error_of([&] {
              parse_chat_request(json{{"messages", messages}, {"tools", {{{"type", "function"}}}}},
                                 kLimits);
            }).param(),
            "tools[0].function");
}

TEST(ChatRequest, LogprobsResponseFormatAndEffort) {
  json messages = {{{"role", "user"}, {"content", "hi"}}};
  auto r = parse_chat_request(json{{"messages", messages},
                                   {"logprobs", true},
                                   {"top_logprobs", 4},
                                   {"response_format", {{"type", "json_object"}}},
                                   {"reasoning_effort", "high"},
                                   {"chat_template_kwargs", {{"thinking_mode", "enabled"}}}},
                              kLimits);
  EXPECT_EQ(r.common.logprobs, 4);
  EXPECT_EQ(r.response_format, "json_object");
  EXPECT_EQ(r.reasoning_effort, "high");
  EXPECT_EQ(r.chat_template_kwargs["thinking_mode"], "enabled");

  EXPECT_EQ(error_of([&] {
              parse_chat_request(json{{"messages", messages}, {"top_logprobs", 2}}, kLimits);
            }).param(),
            "top_logprobs");
  EXPECT_EQ(
      error_of([&] {
        parse_chat_request(json{{"messages", messages}, {"reasoning_effort", "extreme"}}, kLimits);
      }).param(),
      "reasoning_effort");
  EXPECT_EQ(error_of([&] {
              parse_chat_request(
                  json{{"messages", messages}, {"response_format", {{"type", "grammar"}}}},
                  kLimits);
            }).param(),
            "response_format.type");
  EXPECT_EQ(
      error_of([&] {
        parse_chat_request(json{{"messages", messages}, {"max_completion_tokens", 0}}, kLimits);
      }).param(),
      "max_completion_tokens");
}

}  // namespace
}  // namespace m3::server
