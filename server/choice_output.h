// One choice's output text, step by step: generated token ids in, OpenAI deltas out.
//   ids -> incremental detokenizer -> stop strings (held back while they may still match)
//       -> reasoning parser (chat) -> tool-call parser (chat) -> delta
// Streaming and non-streaming responses both run this; a non-streaming response is the
// concatenation of the deltas (the text parsers guarantee that equals their one-shot parse).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/stop_strings.h"
#include "text/detokenizer.h"
#include "text/reasoning_parser.h"
#include "text/tokenizer.h"
#include "text/tool_parser.h"

namespace m3::server {

struct ChoiceTextOptions {
  bool skip_special_tokens = true;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  std::string reasoning_parser;  // empty: no reasoning split
  text::ReasoningOptions reasoning_options;
  std::string tool_parser;                      // empty: no tool-call parsing
  nlohmann::json tools;                         // the request's tools, for argument coercion
  text::ToolCallIdGenerator make_tool_call_id;  // empty: random ids
  // At most this many tool calls (Anthropic's disable_parallel_tool_use: 1); -1: no limit. The
  // output ends where a call past the limit begins, and that call is not reported.
  int max_tool_calls = -1;
};

struct ChoiceDelta {
  std::string content;  // completions: the text; chat: the content
  std::string reasoning;
  std::vector<text::ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

// A finished tool call, assembled from the deltas.
struct AssembledToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

class ChoiceOutput {
 public:
  ChoiceOutput(const text::Tokenizer& tokenizer, ChoiceTextOptions options);

  // Tokens of one engine step. `last_is_stop_token`: the final id is the eos / stop token that
  // ended the output; like vLLM its text is not part of the output unless
  // include_stop_str_in_output. Returns what became final (may be empty).
  ChoiceDelta add_tokens(std::span<const int32_t> ids, bool last_is_stop_token);
  // End of output: releases every held-back piece. Call once, after the last add_tokens.
  ChoiceDelta finish();

  // A stop string matched, or a tool call past max_tool_calls began: the output is over (the
  // caller aborts the engine request).
  bool stopped() const { return stop_.matched() || tool_limit_reached_; }
  bool stopped_by_string() const { return stop_.matched(); }
  const std::string& matched_stop_string() const { return matched_stop_; }
  bool saw_tool_call() const { return tools_ && tools_->saw_tool_call(); }
  // The output is past its reasoning block (false without a reasoning parser).
  bool reasoning_ended() const { return reasoning_parser_ && reasoning_parser_->reasoning_ended(); }

  // Everything emitted so far (for non-streaming responses and tests).
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<AssembledToolCall>& tool_calls() const { return tool_calls_; }

 private:
  ChoiceDelta route_text(std::string text, bool end_of_output);
  // Drops the deltas of calls past max_tool_calls; true when there were any.
  bool drop_calls_past_limit(std::vector<text::ToolCallDelta>& calls) const;
  void remember(const ChoiceDelta& delta);

  text::IncrementalDetokenizer detokenizer_;
  StopStringMatcher stop_;
  std::optional<text::ReasoningParser> reasoning_parser_;
  std::unique_ptr<text::ToolCallParser> tools_;
  bool include_stop_str_;
  int max_tool_calls_;
  bool tool_limit_reached_ = false;
  bool finished_ = false;
  std::string matched_stop_;
  std::string content_, reasoning_;
  std::vector<AssembledToolCall> tool_calls_;
};

}  // namespace m3::server
