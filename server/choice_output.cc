#include "server/choice_output.h"

#include <algorithm>

namespace m3::server {
namespace {

// Appends the parser's flush to the step's delta, at most one delta per call index: a flushed
// piece of a call the step already has extends it (and gives it the id and name if the step's
// piece had none).
void merge_flush(text::ToolStreamDelta& calls, text::ToolStreamDelta rest) {
  calls.content_delta += rest.content_delta;
  for (auto& call : rest.tool_call_deltas) {
    auto same = std::find_if(calls.tool_call_deltas.begin(), calls.tool_call_deltas.end(),
                             [&](const text::ToolCallDelta& d) { return d.index == call.index; });
    if (same == calls.tool_call_deltas.end()) {
      calls.tool_call_deltas.push_back(std::move(call));
    } else {
      if (!same->id) same->id = call.id;
      if (!same->name) same->name = call.name;
      same->arguments_delta += call.arguments_delta;
    }
  }
}

}  // namespace

ChoiceOutput::ChoiceOutput(const text::Tokenizer& tokenizer, ChoiceTextOptions options)
    : detokenizer_(tokenizer, options.skip_special_tokens),
      stop_(std::move(options.stop), options.include_stop_str_in_output),
      include_stop_str_(options.include_stop_str_in_output),
      max_tool_calls_(options.max_tool_calls) {
  if (!options.reasoning_parser.empty()) {
    reasoning_parser_.emplace(options.reasoning_parser, options.reasoning_options);
  }
  if (!options.tool_parser.empty()) {
    tools_ = std::make_unique<text::ToolCallParser>(options.tool_parser, options.tools,
                                                    std::move(options.make_tool_call_id));
  }
}

ChoiceDelta ChoiceOutput::add_tokens(std::span<const int32_t> ids, bool last_is_stop_token) {
  if (finished_ || stopped()) return {};
  if (last_is_stop_token && !include_stop_str_ && !ids.empty()) ids = ids.first(ids.size() - 1);
  std::string text = detokenizer_.push(ids);
  if (text.empty()) return {};
  auto step = stop_.feed(text);
  if (step.matched) matched_stop_ = *step.matched;
  // A matched stop string ends the output here: flush the parsers too.
  return route_text(std::move(step.text), stop_.matched());
}

ChoiceDelta ChoiceOutput::finish() {
  if (finished_) return {};
  ChoiceDelta delta;
  if (!stopped()) {
    std::string tail = detokenizer_.finish();
    auto step = stop_.feed(tail);
    if (step.matched) matched_stop_ = *step.matched;
    std::string text = std::move(step.text);
    if (!stop_.matched()) text += stop_.flush();
    delta = route_text(std::move(text), true);
  }
  finished_ = true;
  return delta;
}

ChoiceDelta ChoiceOutput::route_text(std::string text, bool end_of_output) {
  ChoiceDelta delta;
  if (finished_) return delta;
  std::string content;
  if (reasoning_parser_) {
    text::DeltaMessage split = reasoning_parser_->feed(text);
    if (end_of_output) {
      text::DeltaMessage rest = reasoning_parser_->finish();
      split.reasoning_delta += rest.reasoning_delta;
      split.content_delta += rest.content_delta;
    }
    delta.reasoning = std::move(split.reasoning_delta);
    content = std::move(split.content_delta);
  } else {
    content = std::move(text);
  }
  if (tools_) {
    text::ToolStreamDelta calls = tools_->feed(content);
    if (end_of_output) {
      merge_flush(calls, tools_->finish());
    }
    if (!end_of_output && drop_calls_past_limit(calls.tool_call_deltas)) {
      // A call past the limit began: what the parser still holds belongs to the calls kept
      // (their arguments close); the rest of the output is not read.
      text::ToolStreamDelta rest = tools_->finish();
      drop_calls_past_limit(rest.tool_call_deltas);
      merge_flush(calls, std::move(rest));
      tool_limit_reached_ = true;
      end_of_output = true;
    } else if (end_of_output) {
      drop_calls_past_limit(calls.tool_call_deltas);
    }
    delta.content = std::move(calls.content_delta);
    delta.tool_calls = std::move(calls.tool_call_deltas);
  } else {
    delta.content = std::move(content);
  }
  if (end_of_output) finished_ = true;
  remember(delta);
  return delta;
}

bool ChoiceOutput::drop_calls_past_limit(std::vector<text::ToolCallDelta>& calls) const {
  if (max_tool_calls_ < 0) return false;
  const auto past = std::remove_if(calls.begin(), calls.end(), [&](const text::ToolCallDelta& d) {
    return d.index >= max_tool_calls_;
  });
  const bool dropped = past != calls.end();
  calls.erase(past, calls.end());
  return dropped;
}

void ChoiceOutput::remember(const ChoiceDelta& delta) {
  content_ += delta.content;
  reasoning_ += delta.reasoning;
  for (const text::ToolCallDelta& call : delta.tool_calls) {
    if (call.index >= static_cast<int>(tool_calls_.size())) tool_calls_.resize(call.index + 1);
    AssembledToolCall& assembled = tool_calls_[call.index];
    if (call.id) assembled.id = *call.id;
    if (call.name) assembled.name = *call.name;
    assembled.arguments += call.arguments_delta;
  }
}

}  // namespace m3::server
