// The OpenAI server end to end over the scripted model: exact outputs through the real engine,
// text pipeline (detokenizer, stop strings, reasoning and tool parsers) and HTTP layer.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tests/server/http_client.h"
#include "tests/server/scripted_server.h"

namespace m3::testing {
namespace {

using nlohmann::json;

const std::string kThinkReply = "<mm:think>Two plus two is four.</mm:think>The answer is 4.";
const std::string kToolReply =
    "Let me check.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">"
    "]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<days>3]<]minimax[>[</days>"
    "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>";
const std::string kPlainReply = "Hello! This is a scripted reply, with a STOP word inside it.";

ScriptedServerOptions default_options() {
  ScriptedServerOptions o;
  if (const char* dir = std::getenv("M3SERVE_MODEL")) o.model_dir = dir;
  o.replies = {{"What is 2+2?", kThinkReply}, {"Weather in Paris?", kToolReply}, {"", kPlainReply}};
  o.serve.reasoning_parser = "minimax_m3";
  o.serve.tool_call_parser = "minimax_m3";
  o.serve.enable_auto_tool_choice = true;
  o.serve.enable_prompt_tokens_details = true;
  return o;
}

json user(const std::string& content) { return {{"role", "user"}, {"content", content}}; }

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather forecast", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])");
}

struct Sse {
  std::vector<json> events;
  bool done = false;        // ended with data: [DONE]
  bool well_formed = true;  // every event is "data: <json>\n\n"
};

Sse parse_sse(const std::string& body) {
  Sse sse;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      sse.well_formed = false;
      break;
    }
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) {
      sse.well_formed = false;
      continue;
    }
    std::string data = event.substr(6);
    if (data == "[DONE]") {
      sse.done = true;
      if (pos != body.size()) sse.well_formed = false;  // nothing may follow [DONE]
      break;
    }
    sse.events.push_back(json::parse(data));
  }
  return sse;
}

class ScriptedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ScriptedServer(default_options()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }

  static json post_json(const std::string& path, const json& body, int expected_status = 200) {
    HttpReply reply = http_post(port(), path, body.dump());
    EXPECT_EQ(reply.status, expected_status) << reply.body;
    return json::parse(reply.body);
  }
  static Sse post_stream(const std::string& path, json body) {
    body["stream"] = true;
    HttpReply reply = http_post(port(), path, body.dump());
    EXPECT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(reply.headers["content-type"].rfind("text/event-stream", 0), 0u);
    Sse sse = parse_sse(reply.body);
    EXPECT_TRUE(sse.well_formed) << reply.body;
    EXPECT_TRUE(sse.done) << reply.body;
    return sse;
  }
  static int num_tokens(const std::string& text) {
    return static_cast<int>(server_->tokenizer().encode(text, false).size());
  }

  static ScriptedServer* server_;
};
ScriptedServer* ScriptedServerTest::server_ = nullptr;

TEST_F(ScriptedServerTest, ChatReturnsTheScriptedReply) {
  json r =
      post_json("/v1/chat/completions", {{"model", "scripted"}, {"messages", {user("Hi there")}}});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["model"], "scripted");
  EXPECT_TRUE(r["created"].is_number_integer());
  ASSERT_EQ(r["choices"].size(), 1u);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], kPlainReply);
  EXPECT_TRUE(choice["message"]["reasoning_content"].is_null());
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_TRUE(choice["stop_reason"].is_null());  // eos
  const json& usage = r["usage"];
  EXPECT_EQ(usage["completion_tokens"], num_tokens(kPlainReply) + 1);  // + eos
  EXPECT_EQ(usage["total_tokens"],
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  EXPECT_TRUE(usage["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

TEST_F(ScriptedServerTest, ChatStreamHasRoleChunkDeltasUsageAndDone) {
  json body = {{"messages", {user("Hi there")}}, {"stream_options", {{"include_usage", true}}}};
  Sse sse = post_stream("/v1/chat/completions", body);
  ASSERT_GE(sse.events.size(), 3u);
  const json& first = sse.events.front();
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  std::string content;
  std::string finish;
  for (size_t i = 0; i + 1 < sse.events.size(); ++i) {
    const json& e = sse.events[i];
    EXPECT_EQ(e["id"], first["id"]);
    EXPECT_TRUE(e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    const json& delta = e["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, kPlainReply);
  EXPECT_EQ(finish, "stop");
  const json& last = sse.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], num_tokens(kPlainReply) + 1);
}

TEST_F(ScriptedServerTest, ReasoningIsSplitFromContent) {
  json r = post_json("/v1/chat/completions", {{"messages", {user("What is 2+2?")}}});
  const json& message = r["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Two plus two is four.");
  EXPECT_EQ(message["reasoning"], "Two plus two is four.");
  EXPECT_EQ(message["content"], "The answer is 4.");

  Sse sse = post_stream("/v1/chat/completions", {{"messages", {user("What is 2+2?")}}});
  std::string reasoning, content;
  for (const json& e : sse.events) {
    const json& delta = e["choices"][0]["delta"];
    if (delta.contains("reasoning_content"))
      reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Two plus two is four.");
  EXPECT_EQ(content, "The answer is 4.");

  // thinking_mode "enabled": the prompt already ends with <mm:think>, so the model's output
  // starts inside the reasoning (the script continues after the pre-filled opener).
  json enabled =
      post_json("/v1/chat/completions", {{"messages", {user("What is 2+2?")}},
                                         {"chat_template_kwargs", {{"thinking_mode", "enabled"}}}});
  EXPECT_EQ(enabled["choices"][0]["message"]["reasoning_content"], "Two plus two is four.");
  EXPECT_EQ(enabled["choices"][0]["message"]["content"], "The answer is 4.");
}

TEST_F(ScriptedServerTest, ToolCallsAreParsedWithSchemaTypes) {
  json body = {{"messages", {user("Weather in Paris?")}}, {"tools", weather_tools()}};
  json r = post_json("/v1/chat/completions", body);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Let me check.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            (json{{"city", "Paris"}, {"days", 3}}));

  Sse sse = post_stream("/v1/chat/completions", body);
  std::string arguments, name, id, content, finish;
  for (const json& e : sse.events) {
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) {
      for (const json& d : c["delta"]["tool_calls"]) {
        EXPECT_EQ(d["index"], 0);
        if (d.contains("id")) id = d["id"];
        if (d["function"].contains("name")) name = d["function"]["name"];
        arguments += d["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(arguments, call["function"]["arguments"]);
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(ScriptedServerTest, ToolChoiceNoneLeavesTheMarkupInContent) {
  json body = {{"messages", {user("Weather in Paris?")}},
               {"tools", weather_tools()},
               {"tool_choice", "none"}};
  json r = post_json("/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(r["choices"][0]["message"]["content"].get<std::string>().find("get_weather"),
            std::string::npos);
}

TEST_F(ScriptedServerTest, StopStringsTruncateAndReportTheString) {
  json r =
      post_json("/v1/chat/completions", {{"messages", {user("Hi")}}, {"stop", {"STOP", "zzz"}}});
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello! This is a scripted reply, with a ");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], "STOP");

  json included = post_json(
      "/v1/chat/completions",
      {{"messages", {user("Hi")}}, {"stop", "STOP"}, {"include_stop_str_in_output", true}});
  EXPECT_EQ(included["choices"][0]["message"]["content"],
            "Hello! This is a scripted reply, with a STOP");

  Sse sse = post_stream("/v1/chat/completions", {{"messages", {user("Hi")}}, {"stop", "STOP"}});
  std::string content;
  json stop_reason;
  for (const json& e : sse.events) {
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c.contains("stop_reason") && !c["stop_reason"].is_null()) stop_reason = c["stop_reason"];
  }
  EXPECT_EQ(content, "Hello! This is a scripted reply, with a ");
  EXPECT_EQ(stop_reason, "STOP");
}

TEST_F(ScriptedServerTest, StopTokenIdsEndTheOutputAndAreReported) {
  std::vector<int32_t> ids = server_->tokenizer().encode(kPlainReply, false);
  ASSERT_GT(ids.size(), 4u);
  // The first position where the token has not appeared before, so the stop is unambiguous.
  size_t k = 3;
  while (std::find(ids.begin(), ids.begin() + k, ids[k]) != ids.begin() + k) ++k;
  json r = post_json("/v1/completions",
                     {{"prompt", "Hi]~b]ai\n"}, {"max_tokens", 100}, {"stop_token_ids", {ids[k]}}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], ids[k]);
  EXPECT_EQ(r["usage"]["completion_tokens"], static_cast<int>(k) + 1);
  std::vector<int32_t> before(ids.begin(), ids.begin() + k);
  EXPECT_EQ(r["choices"][0]["text"], server_->tokenizer().decode(before, true));
}

TEST_F(ScriptedServerTest, MaxTokensEndsWithLength) {
  json r =
      post_json("/v1/chat/completions", {{"messages", {user("Hi")}}, {"max_completion_tokens", 3}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  std::vector<int32_t> ids = server_->tokenizer().encode(kPlainReply, false);
  EXPECT_EQ(r["choices"][0]["message"]["content"],
            server_->tokenizer().decode(std::vector<int32_t>(ids.begin(), ids.begin() + 3), true));
}

TEST_F(ScriptedServerTest, CompletionsCarryTextLogprobsAndEcho) {
  const std::string prompt = "Say hi]~b]ai\n";
  json r = post_json("/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}, {"logprobs", 2}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, choice["text"]);
  EXPECT_GT(lp["token_logprobs"][0].get<double>(), -0.01);  // the script's token dominates

  json echo = post_json("/v1/completions",
                        {{"prompt", prompt}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  const json& e = echo["choices"][0];
  EXPECT_EQ(e["text"].get<std::string>().rfind(prompt, 0), 0u);
  size_t prompt_tokens = echo["usage"]["prompt_tokens"];
  ASSERT_EQ(e["logprobs"]["tokens"].size(), prompt_tokens + 2);
  EXPECT_TRUE(e["logprobs"]["token_logprobs"][0].is_null());
  EXPECT_TRUE(e["logprobs"]["token_logprobs"][1].is_number());
}

TEST_F(ScriptedServerTest, ChatLogprobsShape) {
  json r = post_json(
      "/v1/chat/completions",
      {{"messages", {user("Hi")}}, {"max_tokens", 4}, {"logprobs", true}, {"top_logprobs", 3}});
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  for (const json& entry : content) {
    EXPECT_TRUE(entry["token"].is_string());
    EXPECT_TRUE(entry["logprob"].is_number());
    EXPECT_TRUE(entry["bytes"].is_array());
    EXPECT_EQ(entry["top_logprobs"].size(), 3u);
  }
}

TEST_F(ScriptedServerTest, NChoicesAndPromptBatches) {
  json r = post_json("/v1/chat/completions",
                     {{"messages", {user("Hi")}}, {"n", 3}, {"temperature", 0.7}, {"seed", 11}});
  ASSERT_EQ(r["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["message"]["content"], kPlainReply);
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 3 * (num_tokens(kPlainReply) + 1));

  json batch = post_json("/v1/completions",
                         {{"prompt", {"A]~b]ai\n", "B]~b]ai\n"}}, {"n", 2}, {"max_tokens", 2}});
  ASSERT_EQ(batch["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(batch["choices"][i]["index"], i);
}

TEST_F(ScriptedServerTest, PrefixCacheHitIsReportedAsCachedTokens) {
  std::string long_text(600, 'x');
  for (size_t i = 0; i < long_text.size(); i += 7) long_text[i] = ' ';
  json body = {{"messages", {user(long_text)}}, {"max_tokens", 2}};
  post_json("/v1/chat/completions", body);
  json again = post_json("/v1/chat/completions", body);
  int cached = again["usage"]["prompt_tokens_details"]["cached_tokens"];
  int prompt = again["usage"]["prompt_tokens"];
  EXPECT_GE(cached, 16);
  EXPECT_LT(cached, prompt);
  EXPECT_EQ(again["choices"][0]["message"]["content"],
            post_json("/v1/chat/completions", body)["choices"][0]["message"]["content"]);
}

TEST_F(ScriptedServerTest, ClientDisconnectAbortsTheRequest) {
  auto finished_abort = [] {
    std::string metrics = http_get(port(), "/metrics").body;
    size_t pos = metrics.find("finished_reason=\"abort\"} ");
    return pos == std::string::npos ? -1.0 : std::stod(metrics.substr(pos + 25));
  };
  double aborted_before = finished_abort();
  {
    json body = {
        {"messages", {user("Hi")}}, {"stream", true}, {"max_tokens", 1000}, {"ignore_eos", true}};
    OpenRequest request(port(), "POST", "/v1/chat/completions", body.dump());
    std::string got = request.read_until("\"content\":\"Hello");
    ASSERT_NE(got.find("Hello"), std::string::npos);
    // Engine stats are published after each step, so they may lag the first token: wait until
    // they show the request running before hanging up.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->engine().stats().num_running == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(server_->engine().stats().num_running, 0);
  }  // hang up mid-stream
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline &&
         (server_->engine().stats().num_running > 0 ||
          server_->engine().stats().num_used_kv_blocks > 0 || finished_abort() <= aborted_before)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(server_->engine().stats().num_running, 0);
  EXPECT_EQ(finished_abort(), aborted_before + 1);
  EXPECT_EQ(server_->engine().stats().num_used_kv_blocks, 0);
}

TEST_F(ScriptedServerTest, NonStreamingClientDisconnectAbortsToo) {
  auto running = [] {
    return server_->engine().stats().num_running + server_->engine().stats().num_waiting;
  };
  {
    json body = {{"messages", {user("Hi")}}, {"max_tokens", 6000}, {"ignore_eos", true}};
    OpenRequest request(port(), "POST", "/v1/chat/completions", body.dump());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (running() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(running(), 0);
  }  // hang up while it generates
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (running() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(running(), 0);
  EXPECT_LT(server_->engine().stats().generation_tokens_total, 1u << 30);
}

// Valid requests with fields replaced by values of every JSON type, and bodies cut short or with
// flipped bytes: each gets a 200 or an OpenAI error, and the server keeps serving.
TEST_F(ScriptedServerTest, MutatedRequestsNeverBreakTheServer) {
  const std::vector<std::pair<std::string, json>> seeds = {
      {"/v1/chat/completions",
       {{"messages", {user("Hi")}},
        {"max_tokens", 4},
        {"temperature", 0.5},
        {"n", 2},
        {"stop", {"x"}},
        {"logprobs", true},
        {"top_logprobs", 2},
        {"tools", weather_tools()},
        {"tool_choice", "auto"},
        {"stream", false},
        {"seed", 3},
        {"response_format", {{"type", "json_object"}}}}},
      {"/v1/completions",
       {{"prompt", "Say hi]~b]ai\n"},
        {"max_tokens", 4},
        {"echo", true},
        {"logprobs", 1},
        {"top_p", 0.9},
        {"stop_token_ids", {5}},
        {"min_tokens", 1},
        {"presence_penalty", 0.1}}},
      {"/tokenize", {{"prompt", "abc"}, {"add_special_tokens", false}}},
      {"/detokenize", {{"tokens", {1, 2, 3}}}},
      {"/v1/responses",
       {{"input", json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
          {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "c1", "output": "sunny"}])")},
        {"instructions", "Be brief."},
        {"max_output_tokens", 4},
        {"temperature", 0.5},
        {"tools", json::parse(R"([{"type": "function", "name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])")},
        {"tool_choice", "auto"},
        {"parallel_tool_calls", false},
        {"text", {{"format", {{"type", "json_object"}}}}},
        {"reasoning", {{"effort", "low"}}},
        {"store", false}}},
  };
  const std::vector<json> values = {nullptr,
                                    true,
                                    false,
                                    0,
                                    -1,
                                    3,
                                    2.5,
                                    -1e308,
                                    1e308,
                                    4294967296LL,
                                    "",
                                    "text",
                                    "\u0000",
                                    json::array(),
                                    json::array({1, "a"}),
                                    json::object(),
                                    json{{"k", {{"n", nullptr}}}}};
  std::mt19937 rng(1234);
  int requests = 0;
  for (const auto& [path, seed] : seeds) {
    HttpReply valid = http_post(port(), path, seed.dump());
    ASSERT_EQ(valid.status, 200) << path << " " << valid.body;  // what the mutations start from
    for (auto it = seed.begin(); it != seed.end(); ++it) {
      for (const json& value : values) {
        json body = seed;
        body[it.key()] = value;
        for (const char* budget : {"max_tokens", "max_output_tokens"}) {
          if (body.contains(budget) && body[budget].is_number() && body[budget].get<double>() > 8) {
            body[budget] = 4;  // keep the fuzzing fast: long generations prove nothing here
          }
        }
        body["stream"] = false;
        HttpReply reply = http_post(port(), path, body.dump());
        ++requests;
        ASSERT_TRUE(reply.status == 200 || reply.status == 400 || reply.status == 404)
            << path << " " << body.dump() << " -> " << reply.status << " " << reply.body;
        json parsed = json::parse(reply.body, nullptr, false);
        ASSERT_FALSE(parsed.is_discarded()) << reply.body;
        if (reply.status != 200) {
          ASSERT_TRUE(parsed.contains("error")) << reply.body;
        }
      }
    }
    const std::string text = seed.dump();
    for (int trial = 0; trial < 40; ++trial) {
      std::string broken = text;
      if (trial % 2 == 0) {
        broken.resize(rng() % broken.size());
      } else {
        for (int k = 0; k < 3; ++k) broken[rng() % broken.size()] = static_cast<char>(rng() % 256);
      }
      HttpReply reply = http_post(port(), path, broken);
      ++requests;
      ASSERT_TRUE(reply.status == 200 || reply.status == 400 || reply.status == 404)
          << path << " " << broken << " -> " << reply.status << " " << reply.body;
    }
  }
  EXPECT_GT(requests, 400);
  EXPECT_EQ(http_get(port(), "/health").status, 200);
  EXPECT_EQ(server_->engine().stats().num_running, 0);
}

TEST_F(ScriptedServerTest, BadRequestsGetOpenAIErrors) {
  struct Case {
    std::string path, body;
    int status;
    std::string param, words;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, "", "not valid JSON"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", 400,
       "", "UTF-8"},
      {"/v1/chat/completions",
       R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", 404, "model",
       "does not exist"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", 400, "temperature",
       "temperature"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000000})", 400,
       "max_tokens", "maximum context length"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages", "messages"},
      {"/v1/completions", R"({"prompt": [1, 2, 99999999]})", 400, "prompt", "vocabulary"},
      {"/v1/completions", R"({"prompt": "x", "n": "two"})", 400, "n", "integer"},
      {"/v1/nothing", "{}", 404, "", "no route"},
  };
  for (const Case& c : cases) {
    HttpReply reply = http_post(port(), c.path, c.body);
    EXPECT_EQ(reply.status, c.status) << c.body << " -> " << reply.body;
    json error = json::parse(reply.body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << reply.body;
    EXPECT_EQ(error["error"]["code"], c.status);
    EXPECT_TRUE(error["error"]["type"].is_string());
    if (c.param.empty()) {
      EXPECT_TRUE(error["error"]["param"].is_null()) << reply.body;
    } else {
      EXPECT_EQ(error["error"]["param"], c.param) << reply.body;
    }
    EXPECT_NE(error["error"]["message"].get<std::string>().find(c.words), std::string::npos)
        << reply.body;
  }
  // The server still serves after all that.
  EXPECT_EQ(http_get(port(), "/health").status, 200);
}

TEST_F(ScriptedServerTest, PromptLongerThanTheContextIsRejected) {
  std::string huge(server_->engine().max_model_len() * 2, 'a');
  for (size_t i = 0; i < huge.size(); i += 2) huge[i] = ' ';
  HttpReply reply = http_post(port(), "/v1/completions", json{{"prompt", huge}}.dump());
  EXPECT_EQ(reply.status, 400);
  EXPECT_NE(reply.body.find("maximum context length"), std::string::npos) << reply.body;
}

TEST_F(ScriptedServerTest, TokenizeAndDetokenize) {
  json t = post_json("/tokenize", {{"prompt", "Hello world"}});
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], server_->engine().max_model_len());
  json d = post_json("/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["prompt"], "Hello world");
  json chat = post_json("/tokenize", {{"messages", {user("Hi")}}});
  EXPECT_GT(chat["count"].get<int>(), 3);
  HttpReply bad = http_post(port(), "/detokenize", R"({"tokens": [-1]})");
  EXPECT_EQ(bad.status, 400);
}

TEST_F(ScriptedServerTest, ServiceRoutes) {
  HttpReply models = http_get(port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  json m = json::parse(models.body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "scripted");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["max_model_len"], server_->engine().max_model_len());
  EXPECT_EQ(json::parse(http_get(port(), "/version").body)["version"], "test");
  HttpReply metrics = http_get(port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  for (const char* name :
       {"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket", "vllm:num_preemptions_total",
        "vllm:request_success_total"}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
}

// ---- limits and auth need their own servers ----

TEST(ScriptedServerLimits, ApiKeyIsRequiredOnTheApiOnly) {
  ScriptedServerOptions o = default_options();
  o.serve.api_keys = {"sk-test-123"};
  ScriptedServer server(std::move(o));
  std::string body = json{{"messages", {user("Hi")}}, {"max_tokens", 2}}.dump();
  HttpReply missing = http_post(server.port(), "/v1/chat/completions", body);
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], 401);
  HttpReply wrong =
      http_post(server.port(), "/v1/chat/completions", body, {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_NE(wrong.body.find("invalid API key"), std::string::npos);
  HttpReply right = http_post(server.port(), "/v1/chat/completions", body,
                              {{"Authorization", "Bearer sk-test-123"}});
  EXPECT_EQ(right.status, 200) << right.body;
  EXPECT_EQ(http_get(server.port(), "/health").status, 200);
  EXPECT_EQ(http_get(server.port(), "/v1/models").status, 401);
}

TEST(ScriptedServerLimits, OversizedBodiesAndHeadersAreRefused) {
  ScriptedServerOptions o = default_options();
  o.serve.http.max_body_bytes = 4096;
  o.serve.http.max_header_bytes = 2048;
  ScriptedServer server(std::move(o));
  std::string big = json{{"prompt", std::string(10000, 'a')}}.dump();
  HttpReply too_big = http_post(server.port(), "/v1/completions", big);
  EXPECT_EQ(too_big.status, 413);
  EXPECT_NE(too_big.body.find("too large"), std::string::npos) << too_big.body;
  std::map<std::string, std::string> headers;
  for (int i = 0; i < 10; ++i) headers["X-Filler-" + std::to_string(i)] = std::string(500, 'h');
  HttpReply too_many = http_post(server.port(), "/v1/completions", "{}", headers);
  EXPECT_EQ(too_many.status, 431);
  EXPECT_EQ(http_get(server.port(), "/health").status, 200);
}

TEST(ScriptedServerLimits, ConnectionsBeyondTheLimitGet503) {
  ScriptedServerOptions o = default_options();
  o.serve.http.max_connections = 2;
  ScriptedServer server(std::move(o));
  json body = {
      {"messages", {user("Hi")}}, {"stream", true}, {"max_tokens", 2000}, {"ignore_eos", true}};
  OpenRequest a(server.port(), "POST", "/v1/chat/completions", body.dump());
  OpenRequest b(server.port(), "POST", "/v1/chat/completions", body.dump());
  a.read_until("data: ");
  b.read_until("data: ");
  HttpReply third = http_get(server.port(), "/health");
  EXPECT_EQ(third.status, 503);
  EXPECT_NE(third.body.find("concurrent connections"), std::string::npos) << third.body;
  a.close();
  b.close();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline &&
         (status = http_get(server.port(), "/health").status) != 200) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 200);
}

TEST(ScriptedServerLifecycle, HealthReflectsLoadingReadyAndDraining) {
  ScriptedServerOptions o = default_options();
  o.load_model = false;
  ScriptedServer server(std::move(o));
  EXPECT_EQ(http_get(server.port(), "/health").status, 503);
  HttpReply early = http_post(server.port(), "/v1/completions", R"({"prompt": "x"})");
  EXPECT_EQ(early.status, 503);
  EXPECT_NE(early.body.find("loading"), std::string::npos);
  server.publish_model();
  EXPECT_EQ(http_get(server.port(), "/health").status, 200);

  // Draining: a stream in flight finishes; new work and /health get 503 meanwhile. The stream
  // (with 20 logprobs per token) is far larger than the socket buffers, so it cannot end before
  // this test reads it.
  json body = {{"messages", {user("Hi")}}, {"stream", true},   {"max_tokens", 3000},
               {"ignore_eos", true},       {"logprobs", true}, {"top_logprobs", 20}};
  OpenRequest in_flight(server.port(), "POST", "/v1/chat/completions", body.dump());
  in_flight.read_until("data: ");
  std::thread drain([&] {
    server.server().drain_and_stop(std::chrono::seconds(30),
                                   [&] { server.engine().shutdown(false); });
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.server().context().draining() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  HttpReply health = http_get(server.port(), "/health");
  HttpReply refused = http_post(server.port(), "/v1/completions", R"({"prompt": "x"})");
  std::string rest = in_flight.read_until("[DONE]");
  drain.join();
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("shutting down"), std::string::npos) << refused.body;
  EXPECT_NE(rest.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos);
}

// The Anthropic routes answer in Anthropic's shape while the model loads: overloaded_error.
TEST(ScriptedServerLifecycle, MessagesAreOverloadedWhileLoading) {
  ScriptedServerOptions o = default_options();
  o.load_model = false;
  ScriptedServer server(std::move(o));
  const std::string body = R"({"model": "scripted", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})";
  for (const char* path : {"/v1/messages", "/v1/messages/count_tokens"}) {
    HttpReply early = http_post(server.port(), path, body);
    EXPECT_EQ(early.status, 503) << path;
    json error = json::parse(early.body);
    EXPECT_EQ(error["type"], "error") << early.body;
    EXPECT_EQ(error["error"]["type"], "overloaded_error") << early.body;
    EXPECT_NE(error["error"]["message"].get<std::string>().find("loading"), std::string::npos) << early.body;
  }
  server.publish_model();
  HttpReply served = http_post(server.port(), "/v1/messages", json::parse(body).dump());
  EXPECT_EQ(served.status, 200) << served.body;
}

// A /v1/messages stream cut by a shutdown that aborts it ends with Anthropic's error event, not
// with a message_stop that would pass the cut answer off as whole.
TEST(ScriptedServerLifecycle, AnAbortedMessagesStreamEndsWithAnErrorEvent) {
  ScriptedServerOptions o = default_options();
  std::string long_reply;
  for (int i = 0; i < 6000; ++i) long_reply += "word ";
  o.replies = {{"", long_reply}};
  ScriptedServer server(std::move(o));
  json body = {{"model", "scripted"}, {"max_tokens", 7000}, {"stream", true}, {"messages", {user("Hi")}}};
  OpenRequest in_flight(server.port(), "POST", "/v1/messages", body.dump());
  in_flight.read_until("event: content_block_delta");
  server.server().drain_and_stop(std::chrono::milliseconds(0), [&] { server.engine().shutdown(false); });
  std::string rest = in_flight.read_until("event: error");
  const size_t error = rest.find("event: error\ndata: ");
  ASSERT_NE(error, std::string::npos) << rest.substr(rest.size() > 400 ? rest.size() - 400 : 0);
  EXPECT_NE(rest.find("\"type\":\"overloaded_error\"", error), std::string::npos) << rest.substr(error);
  EXPECT_EQ(rest.find("message_stop"), std::string::npos);
}

}  // namespace
}  // namespace m3::testing
