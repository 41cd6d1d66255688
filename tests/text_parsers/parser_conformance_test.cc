// Conformance: streaming in every chunking (one byte at a time, every split into two, random
// splits with fixed seeds) gives exactly the non-streaming result, over a corpus of model
// outputs that includes the failure modes peers hit (docs/reference.md 5.5).
#include <gtest/gtest.h>

#include "stream_harness.h"
#include "test_tools.h"
#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::text {
namespace {

using testing::kNs;
using testing::m2_block;
using testing::m2_invoke;
using testing::m2_param;
using testing::m3_block;
using testing::m3_invoke;
using testing::m3_param;

struct ToolCase {
  std::string label;
  std::string parser;
  std::string text;
  std::size_t calls;  // how many calls the text holds, so the corpus tests what it says
};

std::vector<ToolCase> tool_corpus() {
  const std::string weather = m3_invoke("get_weather", m3_param("city", "Seattle") + m3_param("days", "5"));
  const std::string order = m3_invoke(
      "create_order",
      m3_param("user_id", "42") + m3_param("shipping", m3_param("city", "Zürich") + m3_param("zip", "8001")) +
          m3_param("items", m3_param("item", m3_param("sku", "a\"b") + m3_param("qty", "2")) +
                                m3_param("item", m3_param("sku", "c\\d") + m3_param("qty", "x"))) +
          m3_param("tags", m3_param("item", "日本語") + m3_param("item", "🙂")) + m3_param("urgent", "TRUE") +
          m3_param("options", "[1, {\"k\": null}]") + m3_param("coupon", "null"));
  const std::string elided = kNs + "<invoke name=\"save_file\">" + kNs + "offerta.docx" + kNs + "</filename>" + kNs +
                             "<content>Hello" + kNs + "</content>" + kNs + "</invoke>";
  return {
      {"m3 plain text", "minimax_m3", "Hello ]< world ]<]minimax not a marker <b>x</b> é🙂 ]<]minimax[", 0},
      {"m3 text then call", "minimax_m3", "I'll check the weather.\n\n" + m3_block(weather), 1},
      {"m3 multiple calls", "minimax_m3", m3_block(weather + weather + order), 3},
      {"m3 nested and unicode", "minimax_m3", m3_block(order), 1},
      {"m3 elided first parameter", "minimax_m3", kNs + "<tool_call>\n" + elided + kNs + "</tool_call>", 1},
      {"m3 elided then more calls", "minimax_m3", m3_block(elided + "\n" + weather), 2},
      {"m3 elided nested", "minimax_m3",
       m3_block(m3_invoke("create_order", m3_param("shipping", kNs + "Oslo" + kNs + "</city>" + m3_param("zip", "1")))), 1},
      {"m3 marker that is not an elided tag", "minimax_m3",
       m3_block(m3_invoke("get_weather", kNs + " oops " + m3_param("city", "Oslo"))), 1},
      {"m3 literal closing tags in a value", "minimax_m3",
       m3_block(m3_invoke("save_file", m3_param("content", "<content>x</content>\n" + kNs + "</content> and more " +
                                                               kNs + "<b>bold" + kNs + "</b>") +
                                           m3_param("filename", "f.xml"))), 1},
      {"m3 closer followed by whitespace", "minimax_m3",
       m3_block(m3_invoke("get_weather", m3_param("city", "a") + " \n\t " + m3_param("days", "2") + "\n")), 1},
      {"m3 truncated in a string value", "minimax_m3",
       "ok " + kNs + "<tool_call>\n" + kNs + "<invoke name=\"save_file\">" + kNs + "<content>partial ]<]mini", 1},
      {"m3 truncated in a nested value", "minimax_m3",
       kNs + "<tool_call>\n" + kNs + "<invoke name=\"create_order\">" + kNs + "<items>" + kNs + "<item>" + kNs +
           "<qty>3" + kNs + "</qty>" + kNs + "<sku>z",
       1},
      {"m3 truncated after a closer", "minimax_m3",
       kNs + "<tool_call>\n" + kNs + "<invoke name=\"get_weather\">" + m3_param("city", "x"), 1},
      {"m3 truncated in the header", "minimax_m3", "Sure." + kNs + "<tool_call>\n" + kNs + "<invoke name=\"get_we", 0},
      {"m3 truncated in an elided value", "minimax_m3",
       kNs + "<tool_call>\n" + kNs + "<invoke name=\"save_file\">" + kNs + "offerta", 1},
      {"m3 malformed header then a good call", "minimax_m3",
       m3_block(kNs + "<invoke name=>" + m3_param("city", "X") + kNs + "</invoke>\n" + weather), 1},
      {"m3 header without a closing bracket", "minimax_m3",
       m3_block(kNs + "<invoke name=\"get_weather\"\n" + m3_param("city", "X") + kNs + "</invoke>\n" + weather), 1},
      {"m3 unclosed value then a good call", "minimax_m3",
       m3_block(kNs + "<invoke name=\"get_weather\">" + kNs + "<city>Paris" + weather), 2},
      {"m3 unclosed invoke then a block closer", "minimax_m3",
       kNs + "<tool_call>\n" + kNs + "<invoke name=\"get_weather\">" + m3_param("city", "a") + kNs + "</tool_call>" +
           " after",
       1},
      {"m3 junk in block and body", "minimax_m3",
       m3_block("junk before\n" + m3_invoke("get_weather", "  I think " + m3_param("city", "Oslo") + "\n") +
                " junk after \n" + kNs + "</city> stray"),
       1},
      {"m3 text between blocks", "minimax_m3",
       "A" + m3_block(weather) + " B " + m3_block(m3_invoke("run", m3_param("-A", "3"))) + " C", 2},
      {"m3 invoke without block", "minimax_m3", "x" + weather + "y" + kNs + "</tool_call>z", 1},
      {"m3 unknown tool", "minimax_m3",
       m3_block(m3_invoke("mystery", m3_param("a", "1") + m3_param("b", m3_param("item", "x") + m3_param("item", "y")) +
                                         m3_param("c", m3_param("k", "v") + m3_param("k", "w")))),
       1},
      {"m3 mixed text and elements", "minimax_m3",
       m3_block(m3_invoke("create_order", m3_param("shipping", "text " + m3_param("city", "c")))), 1},
      {"m3 mismatched closer closes the enclosing element", "minimax_m3",
       m3_block(m3_invoke("create_order", kNs + "<shipping>" + kNs + "<city>Rome" + kNs + "</shipping>" +
                                              m3_param("user_id", "7"))),
       1},
      {"m3 empty call and empty values", "minimax_m3",
       m3_block(m3_invoke("run", "") + m3_invoke("save_file", m3_param("content", "") + m3_param("filename", ""))), 2},
      {"m3 control characters", "minimax_m3",
       m3_block(m3_invoke("save_file", m3_param("content", std::string("a\x01\tb\r\n\"\\") + "\x7f"))), 1},
      {"m3 stray tags outside calls", "minimax_m3",
       "a" + kNs + "</tool_call>" + kNs + "</invoke>" + kNs + "<city>b" + kNs + "</city>" + kNs, 0},
      {"m3 nested blocks", "minimax_m3", m3_block(kNs + "<tool_call>\n" + weather + kNs + "<tool_call>" + weather), 2},
      {"m2 text then call", "minimax_m2",
       "Let me look.\n" + m2_block(m2_invoke("get_weather", m2_param("city", "Paris") + m2_param("days", "3"))), 1},
      {"m2 json values and two calls", "minimax_m2",
       m2_block(m2_invoke("create_order", m2_param("shipping", "{\"city\": \"X\", \"zip\": 1}") +
                                              m2_param("tags", "[\"a\"]") + m2_param("price", "2.50")) +
                m2_invoke("run", m2_param("cmd", "ls -la | grep \"<x>\""))),
       2},
      {"m2 literal parameter closer", "minimax_m2",
       m2_block(m2_invoke("save_file", m2_param("content", "<parameter>\n  <hello></hello>\n</parameter>") +
                                           m2_param("filename", "x.xml"))),
       1},
      {"m2 html in content", "minimax_m2", "<p>Use <code>&lt;</code> and </minimax:tool and <invoke</p>", 0},
      {"m2 truncated", "minimax_m2", "<minimax:tool_call>\n<invoke name=\"save_file\">\n<parameter name=\"content\">ab<", 1},
      {"m2 malformed then good", "minimax_m2",
       m2_block("<invoke>\n" + m2_param("x", "1") + "</invoke>\n" + m2_invoke("get_weather", m2_param("city", "Lima"))),
       1},
      {"m2 missing parameter closer", "minimax_m2",
       m2_block("<invoke name=\"get_weather\">\n<parameter name=\"city\">Lima\n</invoke>\n" + m2_invoke("run", "")), 2},
      {"m2 invoke outside block", "minimax_m2", "see " + m2_invoke("run", ""), 0},
  };
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

TEST(ParserConformance, ToolCallStreamingEqualsParseInEveryChunking) {
  const nlohmann::json tools = testing::test_tools();
  for (const ToolCase& c : tool_corpus()) {
    SCOPED_TRACE(c.label);
    const ToolParseResult want = ToolCallParser(c.parser, tools, testing::counting_ids()).parse(c.text);
    ASSERT_EQ(want.tool_calls.size(), c.calls);
    for (const ToolCall& call : want.tool_calls) {
      const auto arguments = nlohmann::json::parse(call.arguments, nullptr, false);
      ASSERT_TRUE(arguments.is_object()) << call.arguments;
    }
    for (const auto& chunking : testing::all_chunkings(c.text)) {
      expect_same(testing::stream_tool_calls(c.parser, tools, chunking.chunks), want, chunking.label);
    }
  }
}

// Nothing the model wrote is lost but markup: without calls, content is the text itself, or for
// M3 the text without its markers and the tags they start.
TEST(ParserConformance, TextWithoutCallsComesBackUnchanged) {
  for (const ToolCase& c : tool_corpus()) {
    if (c.calls != 0 || c.label.find("truncated") != std::string::npos) continue;
    const std::string content = ToolCallParser(c.parser, nullptr).parse(c.text).content;
    if (c.parser == "minimax_m2" || c.text.find(kNs) == std::string::npos) {
      EXPECT_EQ(content, c.text) << c.label;
    } else {
      EXPECT_EQ(content.find(kNs), std::string::npos) << c.label << ": " << content;
    }
  }
  EXPECT_EQ(ToolCallParser("minimax_m3", nullptr)
                .parse("a" + kNs + "</tool_call>" + kNs + "</invoke>" + kNs + "<city>b" + kNs + "</city>" + kNs)
                .content,
            "ab");
}

// Reasoning extraction feeding tool parsing, both streaming, as the server chains them.
TEST(ParserConformance, ReasoningThenToolsStreamingEqualsParse) {
  const nlohmann::json tools = testing::test_tools();
  const std::string text = "Let me think: <" + kNs + "<invoke> is not for now.</mm:think>Checking." +
                           m3_block(m3_invoke("get_weather", m3_param("city", "Kyiv")));
  const ReasoningOptions options{"enabled", {}};
  const ReasoningSplit split = ReasoningParser("minimax_m3", options).parse(text);
  EXPECT_EQ(split.reasoning, "Let me think: <" + kNs + "<invoke> is not for now.");
  const ToolParseResult want = ToolCallParser("minimax_m3", tools, testing::counting_ids()).parse(split.content);
  EXPECT_EQ(want.content, "Checking.");
  ASSERT_EQ(want.tool_calls.size(), 1u);
  for (const auto& chunking : testing::all_chunkings(text)) {
    ReasoningParser reasoning("minimax_m3", options);
    ToolCallParser parser("minimax_m3", tools, testing::counting_ids());
    std::string reasoning_text;
    std::vector<std::string> content_chunks;
    for (const std::string& chunk : chunking.chunks) {
      const DeltaMessage d = reasoning.feed(chunk);
      reasoning_text += d.reasoning_delta;
      content_chunks.push_back(d.content_delta);
    }
    const DeltaMessage last = reasoning.finish();
    reasoning_text += last.reasoning_delta;
    content_chunks.push_back(last.content_delta);
    ASSERT_EQ(reasoning_text, split.reasoning) << chunking.label;
    expect_same(testing::stream_tool_calls("minimax_m3", tools, content_chunks), want, chunking.label);
  }
}

}  // namespace
}  // namespace m3::text
