// One status line on a terminal while a run goes (requests done and failed, in flight, live
// output tokens/s, elapsed), redrawn twice a second on stderr; nothing when stderr is not a
// terminal, so logs and pipes stay clean.
#pragma once
#include <atomic>
#include <string>
#include <thread>

#include "loadgen/replay.h"

namespace m3::loadgen {

class ProgressLine {
 public:
  // `enabled` false (or stderr not a terminal): prints nothing.
  ProgressLine(const LiveCounters& live, std::string label, bool enabled);
  ~ProgressLine();  // stops and clears the line
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

 private:
  const LiveCounters& live_;
  std::string label_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace m3::loadgen
