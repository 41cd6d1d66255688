#include "server/stop_strings.h"

#include <algorithm>

namespace m3::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings, bool include_in_output)
    : stop_strings_(std::move(stop_strings)), include_in_output_(include_in_output) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
}

StopStringMatcher::Step StopStringMatcher::feed(std::string_view delta) {
  Step step;
  if (matched_) return step;
  if (stop_strings_.empty()) {
    step.text.assign(delta);
    return step;
  }
  pending_.append(delta);

  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stop_strings_) {
    size_t pos = pending_.find(stop);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && stop.size() > best->size())) {
      best_pos = pos;
      best = &stop;
    }
  }
  if (best) {
    matched_ = true;
    size_t end = include_in_output_ ? best_pos + best->size() : best_pos;
    step.text = pending_.substr(0, end);
    step.matched = *best;
    pending_.clear();
    return step;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string. No match exists
  // in pending_, so only suffixes shorter than each stop string can still grow into one.
  size_t hold = 0;
  for (const std::string& stop : stop_strings_) {
    size_t max_k = std::min(stop.size() - 1, pending_.size());
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  step.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return step;
}

std::string StopStringMatcher::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace m3::server
