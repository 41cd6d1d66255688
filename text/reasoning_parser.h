// Reasoning parsers for MiniMax models: split generated text into reasoning and content.
// Names as vLLM's --reasoning-parser: "minimax_m3", "minimax_m2", "minimax_m2_append_think".
//
//  minimax_m3: reasoning lies between <mm:think> and </mm:think>. The markers are matched as
//    text, since a generated marker may arrive split over several tokens or chunks.
//    - Output starts inside reasoning when the prompt ended with the opener: thinking_mode
//      "enabled" (the template pre-fills <mm:think>), or as `prompt_ends_in_reasoning` says.
//      A duplicated opener right at the start is then dropped.
//    - Otherwise output starts as content: a stray </mm:think> at the very start (the model
//      repeating the "disabled" prefix) is dropped and everything after it is content; else
//      text before the first <mm:think> is content, the reasoning runs to the first
//      </mm:think>, and everything after that is content (content before and after is joined).
//    - One reasoning block per output: later markers are content. Text is never trimmed.
//    - Reasoning that never closes is reasoning to the end.
//  minimax_m2: the M2 template always pre-fills <think>, so output starts inside reasoning
//    (unless `prompt_ends_in_reasoning` is false): a leading <think> is dropped, everything up
//    to the first </think> is reasoning, the rest content. thinking_mode does not apply to M2.
//  minimax_m2_append_think: no split: content is "<think>" + the output, reasoning is empty.
//
// Streaming holds back only a suffix that may be the start of a marker the parser is looking
// for; finish() releases it. parse() is feed() + finish() on a fresh parser, so a stream in any
// chunking yields exactly what parse() returns.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3::text {

struct ReasoningOptions {
  // chat_template_kwargs.thinking_mode: "" (unset), "enabled", "disabled" or "adaptive".
  std::string thinking_mode;
  // Whether the rendered prompt ends inside reasoning (see prompt_ends_in_reasoning()); when
  // set it overrides what thinking_mode implies.
  std::optional<bool> prompt_ends_in_reasoning;
};

struct DeltaMessage {
  std::string reasoning_delta;
  std::string content_delta;
  bool empty() const { return reasoning_delta.empty() && content_delta.empty(); }
};

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // Throws m3::Error for an unknown parser name or thinking_mode, listing the valid ones.
  explicit ReasoningParser(std::string_view parser_name, const ReasoningOptions& options = {});

  static std::vector<std::string> names();
  // Whether `prompt` (the rendered chat prompt) leaves the model inside reasoning: it ends with
  // the parser's opener, trailing whitespace aside. Markers earlier in the prompt (the M3
  // system prompt quotes them) do not count.
  static bool prompt_ends_in_reasoning(std::string_view parser_name, std::string_view prompt);
  // The marker that ends reasoning in this parser's format ("</mm:think>", "</think>"); output
  // after it is the answer.
  static std::string_view end_marker(std::string_view parser_name);

  DeltaMessage feed(std::string_view text_delta);
  DeltaMessage finish();
  // Whole-output parse. Only on a parser that has not been fed.
  ReasoningSplit parse(std::string_view text);

  // True once the output is past its reasoning block (a closer, or a stray leading closer, was
  // seen; always for minimax_m2_append_think): everything from here on is content.
  bool reasoning_ended() const;

 private:
  enum class Phase { kStart, kContentBefore, kReasoningStart, kReasoning, kContentAfter, kPassThrough };

  bool step(bool end_of_input, DeltaMessage& out);
  DeltaMessage run(std::string_view text, bool end_of_input);

  std::string opener_;
  std::string closer_;
  Phase phase_ = Phase::kStart;
  std::string pending_;  // received text not yet released
  bool fed_ = false;
  bool finished_ = false;
  bool prefix_sent_ = false;  // minimax_m2_append_think: "<think>" already emitted
};

}  // namespace m3::text
