#include "server/responses_output.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "server/openai_response.h"

namespace m3::server {
namespace {

bool has_text(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) {
    return c != ' ' && c != '\n' && c != '\t' && c != '\r';
  });
}

nlohmann::json reasoning_part(std::string text) {
  return {{"type", "reasoning_text"}, {"text", std::move(text)}};
}

nlohmann::json text_part(std::string text) {
  return {{"type", "output_text"},
          {"text", std::move(text)},
          {"annotations", nlohmann::json::array()},
          {"logprobs", nlohmann::json::array()}};
}

void append_entries(nlohmann::json& to, const nlohmann::json& entries) {
  for (const nlohmann::json& e : entries) to.push_back(e);
}

}  // namespace

void ResponseOutputBuilder::add(const ChoiceDelta& delta, Events& events, nlohmann::json logprobs) {
  M3_CHECK(!finished_, "response output: text after the end");
  if (!delta.reasoning.empty()) reasoning(delta.reasoning, events);
  if (!delta.content.empty()) content(delta.content, std::move(logprobs), events);
  for (const text::ToolCallDelta& c : delta.tool_calls) call(c, events);
}

void ResponseOutputBuilder::finish(bool incomplete, Events& events) {
  if (finished_) return;
  finished_ = true;
  const bool held_text = has_text(held_);
  // Whatever was open when the output stopped is what max_output_tokens cut short.
  if (open_ == Kind::kFunctionCall) close(held_text || !incomplete ? "completed" : "incomplete", events);
  if (held_text) {
    if (open_ != Kind::kMessage) {
      if (open_ != Kind::kNone) close("completed", events);
      open(Kind::kMessage, {{"id", make_response_id("msg_")}, {"type", "message"}, {"role", "assistant"}},
           events);
    }
    content(std::exchange(held_, {}), std::exchange(held_logprobs_, nlohmann::json::array()), events);
  }
  held_.clear();
  held_logprobs_ = nlohmann::json::array();
  if (open_ != Kind::kNone) close(incomplete ? "incomplete" : "completed", events);
}

void ResponseOutputBuilder::reasoning(const std::string& text, Events& events) {
  if (open_ != Kind::kReasoning) {
    if (open_ != Kind::kNone) close("completed", events);
    open(Kind::kReasoning, {{"id", make_response_id("rs_")}, {"type", "reasoning"}, {"summary", nlohmann::json::array()}},
         events);
  }
  open_item()["content"][0]["text"].get_ref<std::string&>() += text;
  events.push_back({{"type", "response.reasoning_text.delta"},
                    {"item_id", open_item()["id"]},
                    {"output_index", output_index()},
                    {"content_index", 0},
                    {"delta", text}});
}

void ResponseOutputBuilder::content(const std::string& text, nlohmann::json logprobs, Events& events) {
  if (open_ != Kind::kMessage) {
    held_ += text;
    append_entries(held_logprobs_, logprobs);
    // A message waits for its first non-whitespace text, and for the open call to end.
    if (open_ == Kind::kFunctionCall || !has_text(held_)) return;
    if (open_ != Kind::kNone) close("completed", events);
    open(Kind::kMessage, {{"id", make_response_id("msg_")}, {"type", "message"}, {"role", "assistant"}},
         events);
    std::string all = std::exchange(held_, {});
    return content(all, std::exchange(held_logprobs_, nlohmann::json::array()), events);
  }
  nlohmann::json& part = open_item()["content"][0];
  part["text"].get_ref<std::string&>() += text;
  append_entries(part["logprobs"], logprobs);
  events.push_back({{"type", "response.output_text.delta"},
                    {"item_id", open_item()["id"]},
                    {"output_index", output_index()},
                    {"content_index", 0},
                    {"delta", text},
                    {"logprobs", std::move(logprobs)}});
}

void ResponseOutputBuilder::call(const text::ToolCallDelta& c, Events& events) {
  if (max_tool_calls_ >= 0 && c.index >= max_tool_calls_) return;
  if (c.id || c.name) {  // the first delta of a call: a new item
    if (open_ == Kind::kFunctionCall) close("completed", events);
    if (has_text(held_)) {  // content that came during the previous call, as its own message
      if (open_ != Kind::kNone) close("completed", events);
      open(Kind::kMessage, {{"id", make_response_id("msg_")}, {"type", "message"}, {"role", "assistant"}},
           events);
      content(std::exchange(held_, {}), std::exchange(held_logprobs_, nlohmann::json::array()), events);
    }
    held_.clear();
    held_logprobs_ = nlohmann::json::array();
    if (open_ != Kind::kNone) close("completed", events);
    open(Kind::kFunctionCall,
         {{"id", make_response_id("fc_")},
          {"type", "function_call"},
          {"call_id", c.id.value_or(make_response_id("call_"))},
          {"name", c.name.value_or("")},
          {"arguments", ""}},
         events);
    open_call_ = c.index;
  }
  // The tool parser streams one call at a time, and nothing else opens while a call is open.
  M3_CHECK(open_ == Kind::kFunctionCall && open_call_ == c.index,
           "response output: arguments of tool call {} arrived after it ended", c.index);
  if (c.arguments_delta.empty()) return;
  open_item()["arguments"].get_ref<std::string&>() += c.arguments_delta;
  events.push_back({{"type", "response.function_call_arguments.delta"},
                    {"item_id", open_item()["id"]},
                    {"output_index", output_index()},
                    {"delta", c.arguments_delta}});
}

void ResponseOutputBuilder::open(Kind kind, nlohmann::json item, Events& events) {
  item["status"] = "in_progress";
  if (kind != Kind::kFunctionCall) item["content"] = nlohmann::json::array();
  items_.push_back(item);
  open_ = kind;
  events.push_back({{"type", "response.output_item.added"},
                    {"output_index", output_index()},
                    {"item", std::move(item)}});
  if (kind == Kind::kFunctionCall) return;
  nlohmann::json part = kind == Kind::kReasoning ? reasoning_part("") : text_part("");
  open_item()["content"].push_back(part);
  events.push_back({{"type", "response.content_part.added"},
                    {"item_id", open_item()["id"]},
                    {"output_index", output_index()},
                    {"content_index", 0},
                    {"part", std::move(part)}});
}

void ResponseOutputBuilder::close(const char* status, Events& events) {
  nlohmann::json& item = open_item();
  item["status"] = status;
  const nlohmann::json id = item["id"];
  const int index = output_index();
  if (open_ == Kind::kFunctionCall) {
    events.push_back({{"type", "response.function_call_arguments.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"name", item["name"]},
                      {"arguments", item["arguments"]}});
  } else {
    const nlohmann::json& part = item["content"][0];
    nlohmann::json done = {{"type", open_ == Kind::kReasoning ? "response.reasoning_text.done"
                                                              : "response.output_text.done"},
                           {"item_id", id},
                           {"output_index", index},
                           {"content_index", 0},
                           {"text", part["text"]}};
    if (open_ == Kind::kMessage) done["logprobs"] = part["logprobs"];
    events.push_back(std::move(done));
    events.push_back({{"type", "response.content_part.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part", part}});
  }
  events.push_back({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  open_ = Kind::kNone;
  open_call_ = -1;
}

std::string ResponseOutputBuilder::output_text() const {
  std::string text;
  for (const nlohmann::json& item : items_) {
    if (item["type"] != "message") continue;
    for (const nlohmann::json& part : item["content"]) {
      if (part["type"] == "output_text") text += part["text"].get<std::string>();
    }
  }
  return text;
}

Json ResponseOutputBuilder::chat_message() const {
  Json message = {{"role", "assistant"}};
  std::string content, reasoning;
  Json calls = Json::array();
  for (const nlohmann::json& item : items_) {
    if (item["type"] == "reasoning") {
      reasoning += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "message") {
      content += item["content"][0]["text"].get<std::string>();
    } else {
      // Templates iterate the arguments as a mapping; text that is not a JSON object (a call cut
      // short) is written out as it is.
      const std::string& arguments = item["arguments"].get_ref<const std::string&>();
      Json parsed = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
      calls.push_back({{"id", item["call_id"]},
                       {"type", "function"},
                       {"function",
                        {{"name", item["name"]},
                         {"arguments", parsed.is_object() ? parsed : Json(arguments)}}}});
    }
  }
  message["content"] = content;
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

}  // namespace m3::server
