// Stop strings over a growing output text. Text that could still turn out to be the start of a
// stop string is held back, so a client never receives bytes that a later match would retract.
//
// Matching: the earliest match in the text wins; at equal positions the longest stop string.
// (vLLM takes the first stop string of the list that occurs; earliest-in-text is what a user
// means and differs only when two stop strings overlap.) The text before the match is emitted;
// with `include_in_output` the stop string is emitted too. Operates on bytes: with valid UTF-8
// text and stop strings, matches and hold-back boundaries always fall on character boundaries.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3::server {

class StopStringMatcher {
 public:
  StopStringMatcher(std::vector<std::string> stop_strings, bool include_in_output);

  struct Step {
    std::string text;                    // safe to emit now
    std::optional<std::string> matched;  // the stop string that ended the output
  };
  // Appends generated text. After a match the output is over: later calls return nothing.
  Step feed(std::string_view delta);
  // The output ended without a match: everything held back is released.
  std::string flush();

  bool active() const { return !stop_strings_.empty(); }
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stop_strings_;
  bool include_in_output_;
  std::string pending_;  // received but not yet emitted: always a possible stop-string prefix
  bool matched_ = false;
};

}  // namespace m3::server
