// Rendering time of the MiniMax-M3 chat template for agentic conversations of growing length
// (user turns, assistant turns with reasoning and tool calls, tool results, 8 tool schemas).
// Prints: messages, prompt bytes, microseconds per render (wall clock, and CPU time of this
// process, which a loaded machine does not inflate), MB/s of prompt text per CPU second.
// Run from the repository root: build-*/tests/text_jinja/bench_chat_template
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "text/chat_template.h"

using Json = nlohmann::ordered_json;

namespace {

Json make_tools(int count) {
  Json tools = Json::array();
  for (int k = 0; k < count; ++k) {
    tools.push_back(Json::parse(R"({"type": "function", "function": {"name": "tool_)" + std::to_string(k) +
                                R"(", "description": "Reads a file from the workspace and returns its lines.",
      "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"},
      "count": {"type": "integer"}, "options": {"type": "object", "properties": {"follow": {"type": "boolean"}}}},
      "required": ["path"]}}})"));
  }
  return tools;
}

// Cycles user -> assistant with reasoning and a tool call -> tool -> assistant answer.
Json make_conversation(int messages) {
  Json out = Json::array();
  out.push_back({{"role", "system"}, {"content", "You are a coding agent working in a large repository."}});
  for (int k = 0; static_cast<int>(out.size()) < messages; ++k) {
    switch (k % 4) {
      case 0: out.push_back({{"role", "user"}, {"content", "Please look at src/module_" + std::to_string(k) + ".cc and fix the bug in the parser."}}); break;
      case 1:
        out.push_back(Json::parse(R"({"role": "assistant", "content": "Let me read the file.",
          "reasoning_content": "The user wants a fix; first read the file around the parser entry point.",
          "tool_calls": [{"type": "function", "function": {"name": "tool_1",
          "arguments": {"path": "src/module.cc", "start": 120, "count": 80, "options": {"follow": true}}}}]})"));
        break;
      case 2: out.push_back({{"role", "tool"}, {"content", std::string(600, 'x') + "\n    return parse(tokens);\n"}}); break;
      case 3: out.push_back({{"role", "assistant"}, {"content", "The loop bound was off by one; I changed <= to <."}}); break;
    }
  }
  return out;
}

}  // namespace

int main() {
  std::ifstream in("text/templates/minimax_m3.jinja");
  if (!in) {
    std::fprintf(stderr, "run from the repository root (text/templates/minimax_m3.jinja not found)\n");
    return 1;
  }
  std::ostringstream source;
  source << in.rdbuf();
  m3::text::ChatTemplate tmpl(source.str(), "minimax_m3.jinja");
  std::printf("%-10s %-10s %-10s %-10s %-10s\n", "messages", "prompt_B", "wall_us", "cpu_us", "MB/s_cpu");
  for (int messages : {2, 10, 100, 1000}) {
    m3::text::ChatTemplateInput input;
    input.messages = make_conversation(messages);
    input.tools = make_tools(8);
    input.kwargs = {{"thinking_mode", "enabled"}};
    size_t bytes = tmpl.render(input).size();
    int iterations = messages >= 1000 ? 20 : messages >= 100 ? 200 : 2000;
    auto start = std::chrono::steady_clock::now();
    std::clock_t cpu_start = std::clock();
    for (int k = 0; k < iterations; ++k) bytes = tmpl.render(input).size();
    double cpu_us = 1e6 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / iterations;
    double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                     iterations;
    std::printf("%-10d %-10zu %-10.1f %-10.1f %-10.1f\n", messages, bytes, wall_us, cpu_us, bytes / cpu_us);
  }
  return 0;
}
