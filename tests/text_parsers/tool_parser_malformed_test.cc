// The tool-call parsers on malformed output (what an unconstrained model may write), one rule per
// shape (text/tool_parser.h, "Malformed output"): each case is checked whole against the
// expected message, and streamed in every chunking into two and into three pieces (splits inside
// markers included), which must reassemble to exactly the whole-text result; no markup may
// appear in a value, a key or the content, whole or streamed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stream_harness.h"
#include "test_tools.h"
#include "text/tool_parser.h"

namespace m3::text {
namespace {

using testing::kNs;
using testing::m2_param;
using testing::m3_param;

struct ExpectedCall {
  std::string name;
  std::string arguments;
  bool complete = true;
};

struct MalformedCase {
  std::string label;
  std::string parser;
  std::string text;
  std::string content;
  std::vector<ExpectedCall> calls;
  // Strings that are markup in this case's text and so may appear in no value, key or content.
  std::vector<std::string> markup;
};

const std::vector<std::string> kM3Markup = {kNs, "<", ">"};  // the M3 cases write no other '<' or '>'
const std::vector<std::string> kM2Markup = {"<parameter", "</parameter>", "<invoke", "</invoke>", "minimax:tool_call"};
const std::vector<std::string> kM2StructuralMarkup = {"<parameter name", "<invoke", "</invoke>", "minimax:tool_call"};

std::string m3_head(const std::string& function) {
  return kNs + "<tool_call>\n" + kNs + "<invoke name=\"" + function + "\">";
}
std::string m3_tail() { return kNs + "</invoke>\n" + kNs + "</tool_call>"; }
std::string m2_head(const std::string& function) {
  return "<minimax:tool_call>\n<invoke name=\"" + function + "\">\n";
}
std::string m2_tail() { return "</invoke>\n</minimax:tool_call>"; }

std::vector<MalformedCase> malformed_cases() {
  const std::string days5 = m3_param("days", "5");
  return {
      // Stray text after a closing tag: the closer closes, the text is content.
      {"m3 prose after a closer", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Seattle" + kNs + "</city>I need to use the city above." + days5 + m3_tail(),
       "I need to use the city above.", {{"get_weather", R"({"city":"Seattle","days":5})"}}, kM3Markup},
      {"m3 prose after a nested closer", "minimax_m3",
       m3_head("create_order") + kNs + "<shipping>" + m3_param("city", "Rome") + " so " + m3_param("zip", "1") + kNs +
           "</shipping> done" + m3_tail(),
       "done", {{"create_order", R"({"shipping":"Rome so 1"})"}}, kM3Markup},
      {"m3 prose before the invoke closer", "minimax_m3",
       m3_head("get_weather") + m3_param("city", "Oslo") + " that is all " + m3_tail() + " bye",
       "that is all bye", {{"get_weather", R"({"city":"Oslo"})"}}, kM3Markup},
      // Unclosed values: closed by the next tag that cannot be inside them.
      {"m3 unclosed string value, next parameter", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Seattle" + days5 + m3_tail(), "",
       {{"get_weather", R"({"city":"Seattle","days":5})"}}, kM3Markup},
      {"m3 unclosed string value, elided next parameter", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Seattle" + kNs + "5" + kNs + "</days>" + m3_tail(), "",
       {{"get_weather", R"({"city":"Seattle5"})"}}, kM3Markup},
      {"m3 unclosed values, invoke closer", "minimax_m3",
       m3_head("get_weather") + kNs + "<days>5" + kNs + "</invoke>" + m3_head("get_weather") + kNs + "<city>Lima" +
           m3_tail(),
       "", {{"get_weather", R"({"days":5})"}, {"get_weather", R"({"city":"Lima"})"}}, kM3Markup},
      {"m3 unclosed value, next invoke", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Paris" + kNs + "<invoke name=\"run\">" + m3_param("cmd", "ls") + m3_tail(),
       "", {{"get_weather", R"({"city":"Paris"})"}, {"run", R"({"cmd":"ls"})"}}, kM3Markup},
      {"m3 unclosed nested value, block closer", "minimax_m3",
       m3_head("create_order") + kNs + "<shipping>" + kNs + "<zip>12" + kNs + "</tool_call> after", " after",
       {{"create_order", R"({"shipping":{"zip":12}})"}}, kM3Markup},
      {"m3 unclosed value at the end", "minimax_m3", m3_head("save_file") + kNs + "<content>Hel", "",
       {{"save_file", R"({"content":"Hel"})", false}}, kM3Markup},
      {"m3 string parameter given elements", "minimax_m3",
       m3_head("create_order") + kNs + "<note>" + m3_param("item", "a") + kNs + "</note>" + m3_tail(), "",
       {{"create_order", R"({"note":"","item":"a"})"}}, kM3Markup},
      // Mismatched closers: the innermost open element of that name, else the innermost one.
      {"m3 mismatched closer of a parameter", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Seattle" + kNs + "</town>" + days5 + m3_tail(), "",
       {{"get_weather", R"({"city":"Seattle","days":5})"}}, kM3Markup},
      {"m3 mismatched closer of a nested element", "minimax_m3",
       m3_head("create_order") + kNs + "<shipping>" + kNs + "<city>Rome" + kNs + "</town>" + m3_param("zip", "1") + kNs +
           "</shipping>" + m3_tail(),
       "", {{"create_order", R"({"shipping":{"city":"Rome","zip":1}})"}}, kM3Markup},
      {"m3 closer of the enclosing element", "minimax_m3",
       m3_head("create_order") + kNs + "<shipping>" + kNs + "<city>Rome" + kNs + "</shipping>" +
           m3_param("user_id", "7") + m3_tail(),
       "", {{"create_order", R"({"shipping":{"city":"Rome"},"user_id":7})"}}, kM3Markup},
      {"m3 closer with nothing open", "minimax_m3",
       m3_head("get_weather") + kNs + "</city>" + m3_param("city", "Oslo") + kNs + "</city>" + m3_tail(), "",
       {{"get_weather", R"({"city":"Oslo"})"}}, kM3Markup},
      // Repeated names: the first value stands, the repeat is read and dropped.
      {"m3 string parameter given twice", "minimax_m3",
       m3_head("get_weather") + m3_param("city", "a") + days5 + m3_param("city", "b") + m3_tail(), "",
       {{"get_weather", R"({"city":"a","days":5})"}}, kM3Markup},
      {"m3 number parameter given twice", "minimax_m3",
       m3_head("get_weather") + days5 + m3_param("days", "6") + m3_tail(), "", {{"get_weather", R"({"days":5})"}},
       kM3Markup},
      {"m3 elided parameter repeated", "minimax_m3",
       m3_head("save_file") + kNs + "a.txt" + kNs + "</filename>" + m3_param("filename", "b.txt") + m3_tail(), "",
       {{"save_file", R"({"filename":"a.txt"})"}}, kM3Markup},
      {"m3 repeated key in a later call is its own", "minimax_m3",
       m3_head("get_weather") + m3_param("city", "a") + kNs + "</invoke>" + kNs + "<invoke name=\"get_weather\">" +
           m3_param("city", "b") + m3_tail(),
       "", {{"get_weather", R"({"city":"a"})"}, {"get_weather", R"({"city":"b"})"}}, kM3Markup},
      // Stray markup: dropped wherever it is not structure.
      {"m3 markers and unreadable tags in values", "minimax_m3",
       m3_head("get_weather") + kNs + "<city>Sea" + kNs + "ttle" + kNs + "<>" + kNs + "</city>" + kNs + "<days>" + kNs +
           "<invoke name=>5" + kNs + "</days>" + m3_tail(),
       "", {{"get_weather", R"({"city":"Seattle","days":5})"}}, kM3Markup},
      {"m3 stray tags outside calls and between invokes", "minimax_m3",
       "Hi " + kNs + "</invoke>" + kNs + "<city>there" + kNs + "</city>." + m3_head("run") + kNs + "</invoke>" + kNs +
           "<cmd>x" + kNs + "</cmd>" + kNs + "<tool_call>" + kNs + "</tool_call>" + kNs,
       "Hi there.x", {{"run", "{}"}}, kM3Markup},
      {"m3 unreadable header and a marker before a newline", "minimax_m3",
       m3_head("run") + kNs + "</invoke>" + kNs + "<invoke name=>" + kNs + "<\n" + kNs + "</tool_call>", "<",
       {{"run", "{}"}}, {kNs}},
      {"m3 tag cut by the end", "minimax_m3", "Sure." + m3_head("run") + m3_param("cmd", "ls") + kNs + "</inv", "Sure.",
       {{"run", R"({"cmd":"ls"})", false}}, kM3Markup},

      {"m2 prose after a closer", "minimax_m2",
       m2_head("get_weather") + "<parameter name=\"city\">Seattle</parameter>I need to use the city above." +
           "<parameter name=\"days\">5</parameter></invoke>\n</minimax:tool_call>",
       "I need to use the city above.", {{"get_weather", R"({"city":"Seattle","days":5})"}}, kM2Markup},
      {"m2 prose after a closer at the end", "minimax_m2",
       m2_head("get_weather") + "<parameter name=\"days\">5</parameter> then I stop", "then I stop",
       {{"get_weather", R"({"days":5})", false}}, kM2Markup},
      {"m2 literal closers in a value, then prose", "minimax_m2",
       m2_head("save_file") + "<parameter name=\"content\"><parameter>x</parameter> more</parameter> so" +
           m2_param("filename", "f.xml") + m2_tail(),
       "so", {{"save_file", R"({"content":"<parameter>x</parameter> more","filename":"f.xml"})"}},
       kM2StructuralMarkup},
      {"m2 unclosed value, next parameter", "minimax_m2",
       m2_head("get_weather") + "<parameter name=\"days\">5\n" + m2_param("city", "Lima") + m2_tail(), "",
       {{"get_weather", R"({"days":5,"city":"Lima"})"}}, kM2Markup},
      {"m2 unclosed values, invoke and block closers", "minimax_m2",
       m2_head("get_weather") + "<parameter name=\"city\">Lima</invoke>\n<invoke name=\"run\">" +
           "<parameter name=\"cmd\">ls</minimax:tool_call> ok",
       " ok", {{"get_weather", R"({"city":"Lima"})"}, {"run", R"({"cmd":"ls"})"}}, kM2Markup},
      {"m2 unclosed value, next invoke", "minimax_m2",
       m2_head("get_weather") + "<parameter name=\"city\">Lima" + "<invoke name=\"run\">" + m2_tail(), "",
       {{"get_weather", R"({"city":"Lima"})"}, {"run", "{}"}}, kM2Markup},
      {"m2 parameter given twice", "minimax_m2",
       m2_head("get_weather") + m2_param("city", "a") + m2_param("city", "b") + m2_param("days", "2") + m2_tail(), "",
       {{"get_weather", R"({"city":"a","days":2})"}}, kM2Markup},
      {"m2 stray closers in a block", "minimax_m2",
       "<minimax:tool_call>\n</parameter></invoke>" + m2_head("run").substr(20) + "</parameter>" + m2_param("cmd", "ls") +
           m2_tail(),
       "", {{"run", R"({"cmd":"ls"})"}}, kM2Markup},
  };
}

void collect_strings(const nlohmann::json& value, std::vector<std::string>& out) {
  if (value.is_string()) out.push_back(value.get<std::string>());
  if (value.is_object()) {
    for (const auto& [key, member] : value.items()) {
      out.push_back(key);
      collect_strings(member, out);
    }
  }
  if (value.is_array()) {
    for (const auto& member : value) collect_strings(member, out);
  }
}

void expect_no_markup(const ToolParseResult& r, const MalformedCase& c, const std::string& where) {
  std::vector<std::string> texts = {r.content};
  for (const ToolCall& call : r.tool_calls) {
    const nlohmann::json arguments = nlohmann::json::parse(call.arguments, nullptr, false);
    ASSERT_TRUE(arguments.is_object()) << where << ": " << call.arguments;
    collect_strings(arguments, texts);
  }
  for (const std::string& text : texts) {
    for (const std::string& markup : c.markup) {
      ASSERT_EQ(text.find(markup), std::string::npos) << where << ": markup '" << markup << "' in '" << text << "'";
    }
  }
}

void expect_same(const ToolParseResult& got, const ToolParseResult& want, const std::string& where) {
  ASSERT_EQ(got.content, want.content) << where;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << where;
  for (std::size_t i = 0; i < want.tool_calls.size(); ++i) {
    ASSERT_EQ(got.tool_calls[i].id, want.tool_calls[i].id) << where;
    ASSERT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << where;
    ASSERT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << where;
  }
}

TEST(ToolParserMalformed, WholeTextFollowsTheRules) {
  const nlohmann::json tools = testing::test_tools();
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.label);
    const ToolParseResult r = ToolCallParser(c.parser, tools, testing::counting_ids()).parse(c.text);
    EXPECT_EQ(r.content, c.content);
    ASSERT_EQ(r.tool_calls.size(), c.calls.size());
    for (std::size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.tool_calls[i].name, c.calls[i].name) << i;
      EXPECT_EQ(r.tool_calls[i].arguments, c.calls[i].arguments) << i;
      EXPECT_EQ(r.tool_calls[i].complete, c.calls[i].complete) << i;
    }
    expect_no_markup(r, c, "whole");
  }
}

TEST(ToolParserMalformed, EveryChunkingIntoTwoOrThreePiecesGivesTheWholeResult) {
  const nlohmann::json tools = testing::test_tools();
  for (const MalformedCase& c : malformed_cases()) {
    SCOPED_TRACE(c.label);
    const ToolParseResult want = ToolCallParser(c.parser, tools, testing::counting_ids()).parse(c.text);
    const std::size_t n = c.text.size();
    const auto bytes = testing::all_chunkings(c.text).front();  // one byte at a time
    expect_same(testing::stream_tool_calls(c.parser, tools, bytes.chunks), want, bytes.label);
    for (std::size_t i = 1; i < n; ++i) {
      const ToolParseResult got = testing::stream_tool_calls(c.parser, tools, testing::split_at(c.text, {i}));
      const std::string where = "split at " + std::to_string(i);
      expect_same(got, want, where);
      expect_no_markup(got, c, where);
      for (std::size_t j = i + 1; j < n; ++j) {
        const ToolParseResult got3 = testing::stream_tool_calls(c.parser, tools, testing::split_at(c.text, {i, j}));
        expect_same(got3, want, where + " and " + std::to_string(j));
        if (::testing::Test::HasFatalFailure()) return;
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace m3::text
