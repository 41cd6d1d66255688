// The project's MiniMax chat templates against the format of docs/reference.md
// 5.2 (the reference test checks the interpreter; this checks what the templates say).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/chat_template.h"

namespace m3::text {
namespace {

using Json = nlohmann::ordered_json;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string render_m3(const Json& messages, const Json& kwargs = Json::object(), const Json& tools = Json(),
                      bool generation_prompt = true) {
  static const ChatTemplate tmpl(read("text/templates/minimax_m3.jinja"), "minimax_m3.jinja");
  ChatTemplateInput input;
  input.messages = messages;
  input.kwargs = kwargs;
  input.tools = tools;
  input.add_generation_prompt = generation_prompt;
  return tmpl.render(input);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const Json kHello = Json::array({{{"role", "user"}, {"content", "Hi"}}});

TEST(MiniMaxM3Template, TurnLayoutWithDefaults) {
  std::string prompt = render_m3(kHello);
  EXPECT_EQ(prompt.rfind("]~!b[]~b]system\nYour model version is MiniMax-M3, developed by MiniMax. "
                         "Knowledge cutoff: January 2026.", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("\n\n<thinking_instructions>\n"), std::string::npos);
  EXPECT_NE(prompt.find("Current thinking mode: adaptive."), std::string::npos);
  EXPECT_NE(prompt.find("</thinking_instructions>[e~[\n]~b]developer\nYou are a helpful assistant.[e~[\n"
                        "]~b]user\nHi[e~[\n]~b]ai\n"), std::string::npos) << prompt;
  EXPECT_TRUE(ends_with(prompt, "[e~[\n]~b]ai\n")) << prompt;
}

TEST(MiniMaxM3Template, GenerationPromptFollowsThinkingMode) {
  EXPECT_TRUE(ends_with(render_m3(kHello, {{"thinking_mode", "enabled"}}), "]~b]ai\n<mm:think>"));
  EXPECT_TRUE(ends_with(render_m3(kHello, {{"thinking_mode", "disabled"}}), "]~b]ai\n</mm:think>"));
  EXPECT_TRUE(ends_with(render_m3(kHello, {{"thinking_mode", "adaptive"}}), "[e~[\n]~b]ai\n"));
  EXPECT_NE(render_m3(kHello, {{"thinking_mode", "disabled"}}).find("Current thinking mode: disabled."),
            std::string::npos);
  EXPECT_TRUE(ends_with(render_m3(kHello, Json::object(), Json(), false), "]~b]user\nHi[e~[\n"));
}

TEST(MiniMaxM3Template, RootIsTheSystemBlockAndSystemTheDeveloperBlock) {
  Json messages = Json::array({{{"role", "root"}, {"content", "ROOT TEXT"}},
                               {{"role", "system"}, {"content", "DEV TEXT"}},
                               {{"role", "user"}, {"content", "Hi"}}});
  std::string prompt = render_m3(messages);
  EXPECT_EQ(prompt.rfind("]~!b[]~b]system\nROOT TEXT\n\n<thinking_instructions>", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("[e~[\n]~b]developer\nDEV TEXT[e~[\n]~b]user\nHi"), std::string::npos) << prompt;
}

TEST(MiniMaxM3Template, ReasoningEffortJoinsTheSystemPrompt) {
  std::string prompt = render_m3(kHello, {{"reasoning_effort", "high"}});
  EXPECT_NE(prompt.find("</thinking_instructions>\n\n<effort>high</effort>[e~[\n]~b]developer"),
            std::string::npos) << prompt;
}

TEST(MiniMaxM3Template, PastAssistantTurnsKeepReasoningOrABareThinkEnd) {
  Json messages = Json::array({{{"role", "user"}, {"content", "q1"}},
                               {{"role", "assistant"}, {"content", "a1"}, {"reasoning_content", "r1"}},
                               {{"role", "user"}, {"content", "q2"}},
                               {{"role", "assistant"}, {"content", "a2"}},
                               {{"role", "user"}, {"content", "q3"}}});
  std::string prompt = render_m3(messages);
  EXPECT_NE(prompt.find("]~b]ai\n<mm:think>r1</mm:think>a1[e~[\n"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("]~b]ai\n</mm:think>a2[e~[\n"), std::string::npos) << prompt;
}

TEST(MiniMaxM3Template, ToolsCallsAndResults) {
  Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  Json messages = Json::parse(R"([
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"q": "x", "opts": {"deep": [1, true]}, "skip": null}}},
      {"type": "function", "function": {"name": "f", "arguments": {"q": "y"}}}]},
    {"role": "tool", "content": "r1"},
    {"role": "tool", "content": "r2"}])");
  std::string prompt = render_m3(messages, Json::object(), tools);
  const std::string ns = "]<]minimax[>[";
  EXPECT_NE(prompt.find("<tools>\n<tool>{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}</tool>\n</tools>"),
            std::string::npos) << prompt;
  EXPECT_NE(prompt.find("]~b]ai\n</mm:think>" + ns + "<tool_call>\n" + ns + "<invoke name=\"f\">" + ns + "<q>x" + ns +
                        "</q>" + ns + "<opts>" + ns + "<deep>" + ns + "<item>1" + ns + "</item>" + ns + "<item>true" +
                        ns + "</item>" + ns + "</deep>" + ns + "</opts>" + ns + "</invoke>\n" + ns +
                        "<invoke name=\"f\">" + ns + "<q>y" + ns + "</q>" + ns + "</invoke>\n" + ns +
                        "</tool_call>[e~[\n"),
            std::string::npos) << prompt;
  EXPECT_NE(prompt.find("]~b]tool\n<response>r1</response>\n<response>r2</response>[e~[\n]~b]ai\n"),
            std::string::npos) << prompt;
}

TEST(MiniMaxM3Template, ToolResultWithoutToolCallIsRefused) {
  Json messages = Json::parse(R"([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])");
  try {
    render_m3(messages);
    FAIL() << "expected raise_exception";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no previous assistant message with a tool call"), std::string::npos);
  }
}

// The bundled model carries a copy of the template in its tokenizer_config.json: it must not
// drift from text/templates/minimax_m3.jinja.
TEST(MiniMaxM3Template, BundledModelUsesThisTemplate) {
  const std::string model_dir = "models/minimax-m3-small";
  if (!std::filesystem::exists(model_dir + "/tokenizer_config.json")) GTEST_SKIP() << model_dir << " is not there";
  EXPECT_EQ(ChatTemplate::load(model_dir).source(), read("text/templates/minimax_m3.jinja"));
}

TEST(MiniMaxM2Template, ThinkingAndToolCallFormat) {
  ChatTemplate tmpl(read("text/templates/minimax_m2.jinja"), "minimax_m2.jinja");
  ChatTemplateInput input;
  input.messages = Json::parse(R"([
    {"role": "system", "content": "S"},
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "ok", "reasoning_content": "plan",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": "x", "n": 2}}}]},
    {"role": "tool", "content": "r"}])");
  std::string prompt = tmpl.render(input);
  EXPECT_EQ(prompt.rfind("]~!b[]~b]system\nS[e~[\n]~b]user\ngo[e~[\n", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("]~b]ai\n<think>\nplan\n</think>\n\nok<minimax:tool_call>\n<invoke name=\"f\">\n"
                        "<parameter name=\"a\">x</parameter>\n<parameter name=\"n\">2</parameter>\n</invoke>\n"
                        "</minimax:tool_call>[e~[\n]~b]tool\n<response>r</response>[e~[\n"),
            std::string::npos) << prompt;
  EXPECT_TRUE(ends_with(prompt, "]~b]ai\n<think>\n")) << prompt;
}

}  // namespace
}  // namespace m3::text
