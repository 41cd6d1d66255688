// /v1/responses output items from a choice's deltas, and the stream events that build them: the
// events, replayed as the openai SDK's accumulator does, give exactly the items.
#include "server/responses_output.h"

#include <gtest/gtest.h>

namespace m3::server {
namespace {

using nlohmann::json;

text::ToolCallDelta call_start(int index, std::string id, std::string name, std::string args = "") {
  text::ToolCallDelta d;
  d.index = index;
  d.id = std::move(id);
  d.name = std::move(name);
  d.arguments_delta = std::move(args);
  return d;
}

text::ToolCallDelta call_args(int index, std::string args) {
  text::ToolCallDelta d;
  d.index = index;
  d.arguments_delta = std::move(args);
  return d;
}

ChoiceDelta content(std::string text) { return {.content = std::move(text)}; }
ChoiceDelta reasoning(std::string text) { return {.reasoning = std::move(text)}; }
ChoiceDelta calls(std::vector<text::ToolCallDelta> c) { return {.tool_calls = std::move(c)}; }

// Replays events onto an output list as openai-node's ResponseAccumulator does, checking the
// grammar on the way: every item is added, filled and done in order, deltas only to the open one.
json replay(const std::vector<json>& events) {
  json output = json::array();
  int open = -1;
  for (const json& e : events) {
    const std::string type = e["type"];
    if (type == "response.output_item.added") {
      EXPECT_EQ(open, -1) << "an item opened while another was open";
      EXPECT_EQ(e["output_index"], output.size());
      EXPECT_EQ(e["item"]["status"], "in_progress");
      output.push_back(e["item"]);
      open = e["output_index"];
      continue;
    }
    EXPECT_EQ(e["output_index"], open) << type;
    json& item = output[open];
    if (type != "response.output_item.done") EXPECT_EQ(e["item_id"], item["id"]) << type;
    if (type == "response.content_part.added") {
      item["content"].push_back(e["part"]);
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      EXPECT_EQ(item["type"], type == "response.output_text.delta" ? "message" : "reasoning");
      item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + e["delta"].get<std::string>();
      if (e.contains("logprobs")) {
        for (const json& entry : e["logprobs"]) item["content"][0]["logprobs"].push_back(entry);
      }
    } else if (type == "response.output_text.done" || type == "response.reasoning_text.done") {
      EXPECT_EQ(item["content"][0]["text"], e["text"]);
      if (type == "response.output_text.done") {
        EXPECT_EQ(item["content"][0]["logprobs"], e["logprobs"]);
      }
    } else if (type == "response.content_part.done") {
      EXPECT_EQ(item["content"][0], e["part"]);
    } else if (type == "response.function_call_arguments.delta") {
      item["arguments"] = item["arguments"].get<std::string>() + e["delta"].get<std::string>();
    } else if (type == "response.function_call_arguments.done") {
      EXPECT_EQ(item["arguments"], e["arguments"]);
      EXPECT_EQ(item["name"], e["name"]);
    } else if (type == "response.output_item.done") {
      item["status"] = e["item"]["status"];
      EXPECT_EQ(item, e["item"]);
      open = -1;
    } else {
      ADD_FAILURE() << "unexpected event " << type;
    }
  }
  EXPECT_EQ(open, -1) << "an item was left open";
  return output;
}

TEST(ResponseOutput, ReasoningMessageAndCallsInOrder) {
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(reasoning("Think"), events);
  b.add(reasoning("ing."), events);
  b.add(content("\n\n"), events);  // whitespace between items is no message
  b.add(calls({call_start(0, "call_a", "get_weather", "{\"city\":")}), events);
  b.add(calls({call_args(0, "\"Paris\"}")}), events);
  b.add(calls({call_start(1, "call_b", "get_time", "{}")}), events);
  b.finish(false, events);

  const json& items = b.items();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["summary"], json::array());
  EXPECT_EQ(items[0]["content"], json::parse(R"([{"type": "reasoning_text", "text": "Thinking."}])"));
  EXPECT_EQ(items[1]["type"], "function_call");
  EXPECT_EQ(items[1]["call_id"], "call_a");
  EXPECT_EQ(items[1]["name"], "get_weather");
  EXPECT_EQ(items[1]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(items[1]["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(items[2]["call_id"], "call_b");
  for (const json& item : items) EXPECT_EQ(item["status"], "completed");
  EXPECT_EQ(replay(events), items);
  EXPECT_EQ(b.output_text(), "");

  Json message = b.chat_message();
  EXPECT_EQ(message["reasoning_content"], "Thinking.");
  EXPECT_EQ(message["content"], "");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], Json({{"city", "Paris"}}));
}

TEST(ResponseOutput, MessageTextKeepsItsWhitespaceOnceItHasText) {
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(content("\n"), events);
  EXPECT_TRUE(events.empty());
  b.add(content("Hello"), events);
  b.add(content(" world\n"), events);
  b.finish(true, events);
  ASSERT_EQ(b.items().size(), 1u);
  const json& message = b.items()[0];
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["status"], "incomplete");  // cut short by max_output_tokens
  EXPECT_EQ(message["content"],
            json::parse(R"([{"type": "output_text", "text": "\nHello world\n", "annotations": [], "logprobs": []}])"));
  EXPECT_EQ(b.output_text(), "\nHello world\n");
  EXPECT_EQ(replay(events), b.items());
}

TEST(ResponseOutput, LogprobsGoWithTheTextTheyMade) {
  const auto entry = [](const std::string& token) { return json{{"token", token}, {"logprob", -1.0}}; };
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(reasoning("hmm"), events, json::array());  // reasoning tokens carry none
  b.add(content("\n"), events, json::array({entry("\n")}));  // held whitespace keeps its entry
  b.add(content("Hi"), events, json::array({entry("Hi")}));
  b.add(content(" there"), events, json::array({entry(" "), entry("there")}));
  b.add(content(" "), events, json::array({entry(" ")}));
  b.add(calls({call_start(0, "call_a", "f", "{}")}), events);
  b.add(content("  "), events, json::array({entry("  ")}));  // whitespace before the end: dropped
  b.finish(false, events);
  ASSERT_EQ(b.items().size(), 3u);
  const json& part = b.items()[1]["content"][0];
  EXPECT_EQ(part["text"], "\nHi there ");
  EXPECT_EQ(part["logprobs"], json::array({entry("\n"), entry("Hi"), entry(" "), entry("there"), entry(" ")}));
  EXPECT_EQ(b.items()[0]["content"][0].count("logprobs"), 0u);
  EXPECT_EQ(replay(events), b.items());
  // The first text delta carries the held entry with its own.
  for (const json& e : events) {
    if (e["type"] != "response.output_text.delta") continue;
    EXPECT_EQ(e["delta"], "\nHi");
    EXPECT_EQ(e["logprobs"], json::array({entry("\n"), entry("Hi")}));
    break;
  }
}

TEST(ResponseOutput, ContentDuringACallFollowsTheCall) {
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(content("Let me check."), events);
  b.add(calls({call_start(0, "call_a", "f", "{")}), events);
  b.add(content("stray"), events);  // text inside the call's body
  b.add(calls({call_args(0, "}")}), events);
  b.add(calls({call_start(1, "call_b", "g", "{}")}), events);
  b.add(content("Done."), events);
  b.finish(false, events);
  std::vector<std::string> kinds;
  for (const json& item : b.items()) kinds.push_back(item["type"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"message", "function_call", "message", "function_call", "message"}));
  EXPECT_EQ(b.items()[1]["arguments"], "{}");
  EXPECT_EQ(b.items()[2]["content"][0]["text"], "stray");
  EXPECT_EQ(b.output_text(), "Let me check.strayDone.");
  EXPECT_EQ(replay(events), b.items());
}

TEST(ResponseOutput, CallsPastTheLimitAreLeftOut) {
  ResponseOutputBuilder b(/*max_tool_calls=*/1);
  std::vector<json> events;
  b.add(calls({call_start(0, "call_a", "f", "{}"), call_start(1, "call_b", "g", "{}")}), events);
  b.add(calls({call_args(1, "more")}), events);
  b.finish(false, events);
  ASSERT_EQ(b.items().size(), 1u);
  EXPECT_EQ(b.items()[0]["call_id"], "call_a");
  EXPECT_EQ(replay(events), b.items());
}

TEST(ResponseOutput, ACallCutShortIsIncomplete) {
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(calls({call_start(0, "call_a", "f", "{\"x\":1")}), events);
  b.finish(true, events);
  ASSERT_EQ(b.items().size(), 1u);
  EXPECT_EQ(b.items()[0]["status"], "incomplete");
  // Arguments that are not a JSON object go back to the template as text.
  EXPECT_EQ(b.chat_message()["tool_calls"][0]["function"]["arguments"], "{\"x\":1");
  EXPECT_EQ(replay(events), b.items());
}

TEST(ResponseOutput, EmptyOutputHasNoItems) {
  ResponseOutputBuilder b;
  std::vector<json> events;
  b.add(content(" "), events);
  b.finish(false, events);
  EXPECT_TRUE(b.items().empty());
  EXPECT_TRUE(events.empty());
}

}  // namespace
}  // namespace m3::server
