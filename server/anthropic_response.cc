#include "server/anthropic_response.h"

#include <algorithm>

#include "core/error.h"

namespace m3::server {

std::string anthropic_sse(const nlohmann::json& event) {
  std::string out = "event: ";
  out += event.at("type").get_ref<const std::string&>();
  out += "\ndata: ";
  out += dump_json(event);
  out += "\n\n";
  return out;
}

AnthropicStop anthropic_stop(const ChoiceEnd& end) {
  if (end.finish_reason == "tool_calls") return {"tool_use", nullptr};
  if (end.finish_reason == "length") return {"max_tokens", nullptr};
  if (end.finish_reason == "stop" && end.stop_reason.is_string()) return {"stop_sequence", end.stop_reason};
  if (end.finish_reason == "stop") return {"end_turn", nullptr};
  return {};
}

nlohmann::json anthropic_usage(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens) {
  return {{"input_tokens", prompt_tokens - cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached_tokens},
          {"output_tokens", output_tokens}};
}

text::ToolCallIdGenerator anthropic_tool_use_ids() {
  // The text layer's generator draws "call_" + 24 alphanumerics; the same draw, Anthropic's prefix.
  return [draw = text::random_tool_call_ids()] {
    std::string id = draw();
    const std::string_view prefix = "call_";
    return "toolu_" + (id.starts_with(prefix) ? id.substr(prefix.size()) : id);
  };
}

std::string AnthropicContent::block_delta(nlohmann::json delta) const {
  return anthropic_sse({{"type", "content_block_delta"},
                        {"index", static_cast<int64_t>(blocks_.size()) - 1},
                        {"delta", std::move(delta)}});
}

std::string AnthropicContent::open(Kind kind, nlohmann::json block) {
  std::string out;
  while (kind_ != Kind::kNone) out += end_block();  // a tool_use block may release held text
  kind_ = kind;
  const int64_t index = static_cast<int64_t>(blocks_.size());
  out += anthropic_sse({{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
  blocks_.push_back(std::move(block));
  return out;
}

std::string AnthropicContent::end_block() {
  if (kind_ == Kind::kNone) return {};
  if (kind_ == Kind::kToolUse) {
    nlohmann::json input = arguments_.empty() ? nlohmann::json::object()
                                              : nlohmann::json::parse(arguments_, nullptr, false);
    // The tool parser closes every call's arguments as a JSON object (text/tool_parser.h).
    M3_CHECK(input.is_object(), "tool call {} has arguments that are not a JSON object: {}", call_index_,
             arguments_);
    blocks_.back()["input"] = std::move(input);
    arguments_.clear();
  }
  kind_ = Kind::kNone;
  std::string out = anthropic_sse(
      {{"type", "content_block_stop"}, {"index", static_cast<int64_t>(blocks_.size()) - 1}});
  if (!held_text_.empty()) {
    std::string text = std::move(held_text_);
    held_text_.clear();
    out += append_text(text);
  }
  return out;
}

std::string AnthropicContent::append_text(const std::string& text) {
  std::string out;
  if (kind_ == Kind::kToolUse) {
    held_text_ += text;
    return out;
  }
  if (kind_ != Kind::kText) out = open(Kind::kText, {{"type", "text"}, {"text", ""}});
  blocks_.back()["text"].get_ref<std::string&>() += text;
  out += block_delta({{"type", "text_delta"}, {"text", text}});
  return out;
}

std::string AnthropicContent::add(const ChoiceDelta& delta) {
  std::string out;
  if (!delta.reasoning.empty()) {
    if (kind_ != Kind::kThinking) {
      out += open(Kind::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    blocks_.back()["thinking"].get_ref<std::string&>() += delta.reasoning;
    out += block_delta({{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
  }
  auto calls = [&] {
    for (const text::ToolCallDelta& call : delta.tool_calls) {
      if (kind_ != Kind::kToolUse || call.index != call_index_) {
        out += open(Kind::kToolUse, {{"type", "tool_use"},
                                     {"id", call.id.value_or("")},
                                     {"name", call.name.value_or("")},
                                     {"input", nlohmann::json::object()}});
        call_index_ = call.index;
      }
      if (call.arguments_delta.empty()) continue;
      arguments_ += call.arguments_delta;
      out += block_delta({{"type", "input_json_delta"}, {"partial_json", call.arguments_delta}});
    }
  };
  // Within one step the parser does not keep the order of text and calls: text goes before a
  // call that opens in this step, and after the arguments of a call already open.
  if (kind_ == Kind::kToolUse) {
    calls();
    if (!delta.content.empty()) out += append_text(delta.content);
  } else {
    if (!delta.content.empty()) out += append_text(delta.content);
    calls();
  }
  return out;
}

std::string AnthropicContent::close() {
  std::string out;
  while (kind_ != Kind::kNone) out += end_block();
  return out;
}

}  // namespace m3::server
