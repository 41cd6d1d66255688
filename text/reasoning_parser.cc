#include "text/reasoning_parser.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"

namespace m3::text {
namespace {

constexpr std::string_view kM3Opener = "<mm:think>";
constexpr std::string_view kM3Closer = "</mm:think>";
constexpr std::string_view kM2Opener = "<think>";
constexpr std::string_view kM2Closer = "</think>";

constexpr std::string_view kParserNames[] = {"minimax_m3", "minimax_m2", "minimax_m2_append_think"};
constexpr std::string_view kThinkingModes[] = {"", "enabled", "disabled", "adaptive"};

std::string joined(const auto& names) {
  std::string out;
  for (std::string_view name : names) {
    if (name.empty()) continue;
    out += out.empty() ? "" : ", ";
    out += name;
  }
  return out;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`: the part that
// must wait, since the next chunk may complete the marker.
std::size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const std::size_t longest = std::min(text.size(), marker.size() - 1);
  for (std::size_t n = longest; n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

std::string_view trim_end(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

ReasoningParser::ReasoningParser(std::string_view parser_name, const ReasoningOptions& options) {
  bool known_mode = false;
  for (std::string_view mode : kThinkingModes) known_mode = known_mode || mode == options.thinking_mode;
  M3_CHECK(known_mode, "thinking_mode '{}' is not one of: {}", options.thinking_mode, joined(kThinkingModes));
  bool inside = false;
  if (parser_name == "minimax_m3") {
    opener_ = kM3Opener;
    closer_ = kM3Closer;
    inside = options.prompt_ends_in_reasoning.value_or(options.thinking_mode == "enabled");
  } else if (parser_name == "minimax_m2") {
    opener_ = kM2Opener;
    closer_ = kM2Closer;
    inside = options.prompt_ends_in_reasoning.value_or(true);
  } else if (parser_name == "minimax_m2_append_think") {
    phase_ = Phase::kPassThrough;
    return;
  } else {
    m3::fail("unknown reasoning parser '{}'; valid: {}", parser_name, joined(kParserNames));
  }
  phase_ = inside ? Phase::kReasoningStart : Phase::kStart;
}

std::vector<std::string> ReasoningParser::names() { return {std::begin(kParserNames), std::end(kParserNames)}; }

bool ReasoningParser::prompt_ends_in_reasoning(std::string_view parser_name, std::string_view prompt) {
  prompt = trim_end(prompt);
  if (parser_name == "minimax_m3") return prompt.ends_with(kM3Opener);
  if (parser_name == "minimax_m2") return prompt.ends_with(kM2Opener);
  if (parser_name == "minimax_m2_append_think") return false;
  m3::fail("unknown reasoning parser '{}'; valid: {}", parser_name, joined(kParserNames));
}

std::string_view ReasoningParser::end_marker(std::string_view parser_name) {
  if (parser_name == "minimax_m3") return kM3Closer;
  if (parser_name == "minimax_m2" || parser_name == "minimax_m2_append_think") return kM2Closer;
  m3::fail("unknown reasoning parser '{}'; valid: {}", parser_name, joined(kParserNames));
}

bool ReasoningParser::step(bool end_of_input, DeltaMessage& out) {
  switch (phase_) {
    case Phase::kStart:
      if (pending_.starts_with(closer_)) {  // stray closer: reasoning is over before it began
        pending_.erase(0, closer_.size());
        phase_ = Phase::kContentAfter;
        return true;
      }
      if (!end_of_input && std::string_view(closer_).starts_with(pending_)) return false;
      phase_ = Phase::kContentBefore;
      return true;
    case Phase::kReasoningStart:
      if (pending_.starts_with(opener_)) {  // the pre-filled opener, generated again
        pending_.erase(0, opener_.size());
        phase_ = Phase::kReasoning;
        return true;
      }
      if (!end_of_input && std::string_view(opener_).starts_with(pending_)) return false;
      phase_ = Phase::kReasoning;
      return true;
    case Phase::kContentBefore:
    case Phase::kReasoning: {
      const bool reasoning = phase_ == Phase::kReasoning;
      const std::string& marker = reasoning ? closer_ : opener_;
      std::string& sink = reasoning ? out.reasoning_delta : out.content_delta;
      const std::size_t at = pending_.find(marker);
      if (at != std::string::npos) {
        sink.append(pending_, 0, at);
        pending_.erase(0, at + marker.size());
        phase_ = reasoning ? Phase::kContentAfter : Phase::kReasoning;
        return true;
      }
      const std::size_t keep = end_of_input ? 0 : partial_marker_suffix(pending_, marker);
      sink.append(pending_, 0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return false;
    }
    case Phase::kContentAfter:
    case Phase::kPassThrough:
      out.content_delta += pending_;
      pending_.clear();
      return false;
  }
  return false;
}

DeltaMessage ReasoningParser::run(std::string_view text, bool end_of_input) {
  M3_CHECK(!finished_, "ReasoningParser: input after finish()");
  fed_ = true;
  DeltaMessage out;
  if (phase_ == Phase::kPassThrough && !prefix_sent_) {
    out.content_delta = kM2Opener;
    prefix_sent_ = true;
  }
  pending_.append(text);
  while (!pending_.empty() && step(end_of_input, out)) {
  }
  finished_ = end_of_input;
  return out;
}

DeltaMessage ReasoningParser::feed(std::string_view text_delta) { return run(text_delta, false); }

DeltaMessage ReasoningParser::finish() { return run({}, true); }

ReasoningSplit ReasoningParser::parse(std::string_view text) {
  M3_CHECK(!fed_, "ReasoningParser::parse needs a parser that has not been fed");
  ReasoningSplit split;
  for (const DeltaMessage& delta : {feed(text), finish()}) {
    split.reasoning += delta.reasoning_delta;
    split.content += delta.content_delta;
  }
  return split;
}

bool ReasoningParser::reasoning_ended() const {
  return phase_ == Phase::kContentAfter || phase_ == Phase::kPassThrough;
}

}  // namespace m3::text
