// Synthetic Weka-format sessions with the shape of published agentic-coding traces: a large
// system + tools prefix, a context that grows by the last output and a tool result each turn
// (lognormal sizes), lognormal outputs, heavy-tailed think times (main agent: median ~5 s, mean
// far above it), and sub-agents (own context, short think times) that the main agent waits for.
// The same seed gives the same sessions, byte for byte.
#pragma once
#include <cstdint>
#include <vector>

#include "loadgen/trace.h"

namespace m3::loadgen {

struct GeneratorOptions {
  int num_sessions = 16;
  uint64_t seed = 0;
  int64_t block_size = 64;
  double median_turns = 20;            // main-agent requests per session (lognormal, sigma 0.8)
  double median_system_tokens = 3000;  // system prompt of turn 0
  double median_tool_tokens = 12000;   // tool definitions, counted with the system prompt
  double median_new_tokens = 1500;     // tool result / user input added per turn (sigma 1.2)
  double median_output_tokens = 200;   // out (sigma 1.0)
  double think_median_s = 5.0;         // main agent (sigma 2.8: mean ~250 s, p99 ~1 h)
  double think_sigma = 2.8;
  double subagent_probability = 0.05;  // per main-agent turn: spawn 1-3 sub-agents there
  double subagent_median_turns = 8;
  double subagent_think_median_s = 1.0;
  int64_t max_context_tokens = 1000000;  // a session ends before a request's in + out passes it
};

std::vector<Session> generate_traces(const GeneratorOptions& options);

}  // namespace m3::loadgen
