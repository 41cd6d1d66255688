#include "text/tool_parser.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "stream_harness.h"
#include "test_tools.h"

namespace m3::text {
namespace {

using testing::counting_ids;
using testing::kNs;
using testing::m2_block;
using testing::m2_invoke;
using testing::m2_param;
using testing::m3_block;
using testing::m3_invoke;
using testing::m3_param;
using testing::test_tools;

ToolParseResult parse(std::string_view parser, std::string_view text) {
  return ToolCallParser(parser, test_tools(), counting_ids()).parse(text);
}

void expect_call(const ToolParseResult& r, std::size_t i, std::string_view name, std::string_view arguments,
                 bool complete = true) {
  ASSERT_LT(i, r.tool_calls.size());
  EXPECT_EQ(r.tool_calls[i].id, "call_" + std::to_string(i));
  EXPECT_EQ(r.tool_calls[i].name, name);
  EXPECT_EQ(r.tool_calls[i].arguments, arguments);
  EXPECT_EQ(r.tool_calls[i].complete, complete);
}

TEST(ToolParserM3, TextWithoutCallsIsContent) {
  const std::string text = "Plain answer with ]brackets[ and <tags> and a partial marker ]<]mini";
  const ToolParseResult r = parse("minimax_m3", text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserM3, SingleCallAfterText) {
  const ToolParseResult r = parse(
      "minimax_m3",
      "Let me check. " + m3_block(m3_invoke("get_weather", m3_param("city", "Seattle") + m3_param("days", "5"))));
  EXPECT_EQ(r.content, "Let me check. ");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  expect_call(r, 0, "get_weather", R"({"city":"Seattle","days":5})");
}

TEST(ToolParserM3, SeveralInvokesInOneBlock) {
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("get_weather", m3_param("city", "Paris")) +
                                                         m3_invoke("get_weather", m3_param("city", "Rome"))));
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  expect_call(r, 0, "get_weather", R"({"city":"Paris"})");
  expect_call(r, 1, "get_weather", R"({"city":"Rome"})");
}

TEST(ToolParserM3, NestedArgumentsFollowTheSchema) {
  const std::string items = m3_param("item", m3_param("sku", "book-001") + m3_param("qty", "2")) +
                            m3_param("item", m3_param("sku", "pen-007") + m3_param("qty", "5"));
  const std::string body =
      m3_param("user_id", "42") + m3_param("urgent", "true") + m3_param("note", "Leave at the \"front\" desk.") +
      m3_param("price", "19.5") + m3_param("coupon", "null") +
      m3_param("shipping", m3_param("city", "Singapore") + m3_param("zip", "018956")) + m3_param("items", items) +
      m3_param("tags", m3_param("item", "gift") + m3_param("item", "fragile")) +
      m3_param("metadata", m3_param("score", "42") + m3_param("rank", "7")) + m3_param("options", "{\"a\": [1]}");
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("create_order", body)));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  expect_call(r, 0, "create_order",
              R"({"user_id":42,"urgent":true,"note":"Leave at the \"front\" desk.","price":19.5,"coupon":null,)"
              R"("shipping":{"city":"Singapore","zip":18956},"items":[{"sku":"book-001","qty":2},)"
              R"({"sku":"pen-007","qty":5}],"tags":["gift","fragile"],"metadata":{"score":42,"rank":7},)"
              R"("options":{"a":[1]}})");
}

TEST(ToolParserM3, EmptyObjectsAndArraysRenderAsNothing) {
  const ToolParseResult r =
      parse("minimax_m3", m3_block(m3_invoke("create_order", m3_param("shipping", "") + m3_param("tags", ""))));
  expect_call(r, 0, "create_order", R"({"shipping":{},"tags":[]})");
}

TEST(ToolParserM3, ElidedFirstParameterTag) {
  // Real capture from MiniMax-M3-MXFP8 (vLLM PR #51075): the first parameter has no opening tag.
  const std::string text = kNs + "<tool_call>\n" + kNs + "<invoke name=\"save_file\">" + kNs + "offerta.docx" + kNs +
                           "</filename>" + kNs + "<content>Hello" + kNs + "</content>" + kNs + "</invoke>" + kNs +
                           "</tool_call>";
  const ToolParseResult r = parse("minimax_m3", text);
  EXPECT_EQ(r.content, "");
  expect_call(r, 0, "save_file", R"({"filename":"offerta.docx","content":"Hello"})");
}

TEST(ToolParserM3, ElidedTagInsideANestedObject) {
  const std::string shipping = kNs + "Singapore" + kNs + "</city>" + m3_param("zip", "018956");
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("create_order", m3_param("shipping", shipping))));
  expect_call(r, 0, "create_order", R"({"shipping":{"city":"Singapore","zip":18956}})");
}

TEST(ToolParserM3, MarkerWithoutAClosingTagIsNotAParameter) {
  // The marker and its text meet an opening tag before any closing tag: the text is content (the
  // marker is dropped), and the call goes on.
  const ToolParseResult r =
      parse("minimax_m3", m3_block(m3_invoke("get_weather", kNs + "oops " + m3_param("city", "Oslo"))));
  EXPECT_EQ(r.content, "oops ");
  expect_call(r, 0, "get_weather", R"({"city":"Oslo"})");
}

TEST(ToolParserM3, ValueMayContainUnmarkedClosingTags) {
  // A literal </content> (no marker) is text; a marked one always closes, and what follows it
  // before the next tag is stray text (content); the marked closer that follows is stray markup.
  const std::string value = "<content>hi</content>\n" + kNs + "</content> is how M3 closes it\n";
  const ToolParseResult r = parse(
      "minimax_m3", m3_block(m3_invoke("save_file", m3_param("filename", "a.xml") + m3_param("content", value))));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  const nlohmann::json arguments = nlohmann::json::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(arguments["filename"], "a.xml");
  EXPECT_EQ(arguments["content"], "<content>hi</content>\n");
  EXPECT_EQ(r.content, "is how M3 closes it");
}

TEST(ToolParserM3, StringValuesAreVerbatim) {
  const std::string value = "\n  line 1\n\tline \"2\" \\ é🙂\n";
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("save_file", m3_param("content", value))));
  EXPECT_EQ(nlohmann::json::parse(r.tool_calls[0].arguments)["content"], value);
}

TEST(ToolParserM3, UnparseableNumbersFallBackToStrings) {
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("get_weather", m3_param("days", "five"))));
  expect_call(r, 0, "get_weather", R"({"days":"five"})");
}

TEST(ToolParserM3, UnknownToolsAndParametersKeepText) {
  const ToolParseResult r = parse(
      "minimax_m3", m3_block(m3_invoke("mystery", m3_param("n", "5") + m3_param("o", m3_param("k", "v")) +
                                                      m3_param("list", m3_param("item", "1") + m3_param("item", "2")))));
  expect_call(r, 0, "mystery", R"({"n":"5","o":{"k":"v"},"list":["1","2"]})");
}

TEST(ToolParserM3, ParameterNamesMayHoldPunctuation) {
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("run", m3_param("-A", "3") + m3_param("cmd", "ls"))));
  expect_call(r, 0, "run", R"({"-A":3,"cmd":"ls"})");
}

TEST(ToolParserM3, RepeatedTopLevelKeyKeepsTheFirstValue) {
  const ToolParseResult r =
      parse("minimax_m3", m3_block(m3_invoke("get_weather", m3_param("city", "a") + m3_param("city", "b"))));
  expect_call(r, 0, "get_weather", R"({"city":"a"})");
  EXPECT_EQ(r.content, "");
}

TEST(ToolParserM3, TruncatedInsideAValueKeepsTheCall) {
  const ToolParseResult r =
      parse("minimax_m3", kNs + "<tool_call>\n" + kNs + "<invoke name=\"save_file\">" + kNs + "<content>Hel");
  EXPECT_EQ(r.content, "");
  expect_call(r, 0, "save_file", R"({"content":"Hel"})", /*complete=*/false);
}

TEST(ToolParserM3, TruncatedInsideNestedValueKeepsTheCall) {
  const ToolParseResult r = parse("minimax_m3", kNs + "<tool_call>\n" + kNs + "<invoke name=\"create_order\">" +
                                                    m3_param("user_id", "1") + kNs + "<shipping>" + kNs + "<zip>12");
  expect_call(r, 0, "create_order", R"({"user_id":1,"shipping":{"zip":12}})", /*complete=*/false);
}

TEST(ToolParserM3, TruncatedHeaderIsDropped) {
  const ToolParseResult r = parse("minimax_m3", "Sure." + kNs + "<tool_call>\n" + kNs + "<invoke name=\"get_wea");
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserM3, MalformedCallDoesNotLoseTheNextOne) {
  const std::string bad = kNs + "<invoke name=>" + m3_param("city", "X") + kNs + "</invoke>\n";
  const ToolParseResult r =
      parse("minimax_m3", m3_block(bad + m3_invoke("get_weather", m3_param("city", "Lima"))));
  EXPECT_EQ(r.content, "X");  // the unreadable header and the tags out of place are dropped
  ASSERT_EQ(r.tool_calls.size(), 1u);
  expect_call(r, 0, "get_weather", R"({"city":"Lima"})");
}

TEST(ToolParserM3, UnclosedValueIsClosedByTheNextInvoke) {
  const std::string first = kNs + "<invoke name=\"get_weather\">" + kNs + "<city>Paris";
  const ToolParseResult r = parse("minimax_m3", m3_block(first + m3_invoke("get_weather", m3_param("city", "Rome"))));
  ASSERT_EQ(r.tool_calls.size(), 2u);
  expect_call(r, 0, "get_weather", R"({"city":"Paris"})");
  expect_call(r, 1, "get_weather", R"({"city":"Rome"})");
}

TEST(ToolParserM3, UnclosedValueIsClosedByTheInvokeCloser) {
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("get_weather", kNs + "<city>Paris")));
  expect_call(r, 0, "get_weather", R"({"city":"Paris"})");
}

TEST(ToolParserM3, StrayTextInABodyIsContent) {
  const ToolParseResult r =
      parse("minimax_m3", m3_block(m3_invoke("get_weather", "\nI will ask. " + m3_param("city", "Oslo") + "\n")));
  EXPECT_EQ(r.content, "I will ask.");
  expect_call(r, 0, "get_weather", R"({"city":"Oslo"})");
}

TEST(ToolParserM3, ProseRightAfterACloserIsContent) {
  const std::string body = kNs + "<city>Oslo" + kNs + "</city>, I think." + kNs + "</invoke>";
  const ToolParseResult r = parse("minimax_m3", m3_block(kNs + "<invoke name=\"get_weather\">" + body));
  expect_call(r, 0, "get_weather", R"({"city":"Oslo"})");
  EXPECT_EQ(r.content, ", I think.");
}

TEST(ToolParserM3, TextAroundAndBetweenBlocks) {
  const std::string text = "A" + m3_block(m3_invoke("get_weather", m3_param("city", "x"))) + " B " +
                           m3_block(m3_invoke("get_weather", m3_param("city", "y"))) + " C";
  const ToolParseResult r = parse("minimax_m3", text);
  EXPECT_EQ(r.content, "A B  C");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  expect_call(r, 1, "get_weather", R"({"city":"y"})");
}

TEST(ToolParserM3, InvokeWithoutBlockIsACall) {
  const ToolParseResult r =
      parse("minimax_m3", "Calling." + m3_invoke("get_weather", m3_param("city", "Quito")) + kNs + "</tool_call>");
  EXPECT_EQ(r.content, "Calling.");
  expect_call(r, 0, "get_weather", R"({"city":"Quito"})");
}

TEST(ToolParserM3, StrayTagsOutsideCallsAreDropped) {
  const std::string text = "x" + kNs + "</tool_call>" + m3_param("city", "y") + kNs + "</invoke>";
  const ToolParseResult r = parse("minimax_m3", text);
  EXPECT_EQ(r.content, "xy");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserM3, CallWithoutArguments) {
  const ToolParseResult r = parse("minimax_m3", m3_block(m3_invoke("run", "")));
  expect_call(r, 0, "run", "{}");
}

TEST(ToolParserM3, InvokeNameQuotingVariants) {
  for (const std::string header : {"<invoke name='run'>", "<invoke name=run>", "<invoke  name = \"run\" >"}) {
    const ToolParseResult r = parse("minimax_m3", m3_block(kNs + header + kNs + "</invoke>"));
    ASSERT_EQ(r.tool_calls.size(), 1u) << header;
    EXPECT_EQ(r.tool_calls[0].name, "run");
  }
}

TEST(ToolParserM3, ArgumentsStreamAsTheyArrive) {
  ToolCallParser parser("minimax_m3", test_tools(), counting_ids());
  ToolStreamDelta d = parser.feed("Ok." + kNs + "<tool_call>\n" + kNs + "<invoke name=\"save_file\">");
  EXPECT_EQ(d.content_delta, "Ok.");
  ASSERT_EQ(d.tool_call_deltas.size(), 1u);
  EXPECT_EQ(d.tool_call_deltas[0].id, "call_0");
  EXPECT_EQ(d.tool_call_deltas[0].name, "save_file");
  EXPECT_EQ(d.tool_call_deltas[0].arguments_delta, "");
  EXPECT_TRUE(parser.saw_tool_call());

  d = parser.feed(kNs + "<content>Hello");
  ASSERT_EQ(d.tool_call_deltas.size(), 1u);
  EXPECT_FALSE(d.tool_call_deltas[0].id.has_value());
  EXPECT_EQ(d.tool_call_deltas[0].arguments_delta, R"({"content":"Hello)");
  EXPECT_EQ(parser.feed(" wor").tool_call_deltas.at(0).arguments_delta, " wor");
  EXPECT_EQ(parser.feed("ld\n]<]mini").tool_call_deltas.at(0).arguments_delta, "ld\\n");  // marker held back
  EXPECT_EQ(parser.feed("max[>[</content>").tool_call_deltas.at(0).arguments_delta, "\"");  // a marked closer closes
  EXPECT_TRUE(parser.feed(kNs).empty());
  EXPECT_EQ(parser.feed("<filename>").tool_call_deltas.at(0).arguments_delta, R"(,"filename":")");
  EXPECT_EQ(parser.feed("a.txt" + kNs + "</filename>" + kNs + "</invoke>").tool_call_deltas.at(0).arguments_delta,
            "a.txt\"}");
  d = parser.finish();
  EXPECT_TRUE(d.empty());
}

TEST(ToolParserM3, NonStringValuesAreSentWhole) {
  ToolCallParser parser("minimax_m3", test_tools(), counting_ids());
  parser.feed(kNs + "<tool_call>\n" + kNs + "<invoke name=\"get_weather\">");
  EXPECT_EQ(parser.feed(kNs + "<days>1").tool_call_deltas.at(0).arguments_delta, R"({"days":)");
  EXPECT_TRUE(parser.feed("2").empty());
  EXPECT_EQ(parser.feed(kNs + "</days>").tool_call_deltas.at(0).arguments_delta, "12");
  EXPECT_EQ(parser.feed(kNs + "</invoke>").tool_call_deltas.at(0).arguments_delta, "}");
}

TEST(ToolParser, DefaultIdsAreRandomAlphanumerics) {
  std::set<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    const ToolParseResult r =
        ToolCallParser("minimax_m3", test_tools()).parse(m3_block(m3_invoke("run", "")));
    const std::string& id = r.tool_calls.at(0).id;
    ASSERT_EQ(id.size(), 29u);
    EXPECT_TRUE(id.starts_with("call_"));
    for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 20u);
}

TEST(ToolParser, SawToolCall) {
  ToolCallParser parser("minimax_m3", test_tools());
  parser.feed("no calls here");
  parser.finish();
  EXPECT_FALSE(parser.saw_tool_call());
}

TEST(ToolParser, RejectsUnknownNamesAndMisuse) {
  try {
    ToolCallParser parser("hermes", test_tools());
    FAIL() << "no error";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("minimax_m3, minimax_m2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ToolCallParser("minimax_m3", nlohmann::json::parse(R"([{"function":{}}])")), m3::Error);
  ToolCallParser parser("minimax_m3", nullptr);
  parser.feed("a");
  EXPECT_THROW(parser.parse("b"), m3::Error);
  parser.finish();
  EXPECT_THROW(parser.feed("c"), m3::Error);
  EXPECT_EQ(ToolCallParser::names(), (std::vector<std::string>{"minimax_m3", "minimax_m2"}));
}

TEST(ToolParserM2, SingleCallAfterText) {
  const ToolParseResult r = parse(
      "minimax_m2", "Let me.\n" + m2_block(m2_invoke("get_weather", m2_param("city", "Paris") + m2_param("days", "3"))));
  EXPECT_EQ(r.content, "Let me.\n");
  expect_call(r, 0, "get_weather", R"({"city":"Paris","days":3})");
}

TEST(ToolParserM2, JsonTextValues) {
  const ToolParseResult r = parse(
      "minimax_m2", m2_block(m2_invoke("create_order", m2_param("shipping", R"({"city": "X", "zip": "0123"})") +
                                                           m2_param("tags", R"(["a", "b"])") + m2_param("urgent", "False")) +
                             m2_invoke("run", "")));
  ASSERT_EQ(r.tool_calls.size(), 2u);
  expect_call(r, 0, "create_order", R"({"shipping":{"city":"X","zip":"0123"},"tags":["a","b"],"urgent":false})");
  expect_call(r, 1, "run", "{}");
}

TEST(ToolParserM2, ValueMayContainTheParameterCloser) {
  // vLLM #44060: writing XML that contains </parameter> truncated the argument.
  const std::string xml = "<parameter>\n  <hello></hello>\n</parameter>";
  const ToolParseResult r =
      parse("minimax_m2", m2_block(m2_invoke("save_file", m2_param("content", xml) + m2_param("filename", "p.xml"))));
  expect_call(r, 0, "save_file", "{\"content\":" + nlohmann::json(xml).dump() + ",\"filename\":\"p.xml\"}");
}

TEST(ToolParserM2, InvokeOutsideABlockIsContent) {
  const std::string text = "Example: " + m2_invoke("run", "");
  const ToolParseResult r = parse("minimax_m2", text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ToolParserM2, TruncatedCall) {
  const ToolParseResult r = parse("minimax_m2", "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Par");
  expect_call(r, 0, "get_weather", R"({"city":"Par"})", false);
}

TEST(ToolParserM2, M3MarkupIsContentForM2AndBack) {
  const std::string m3 = m3_block(m3_invoke("run", ""));
  EXPECT_EQ(parse("minimax_m2", m3).content, m3);
  const std::string m2 = m2_block(m2_invoke("run", ""));
  EXPECT_EQ(parse("minimax_m3", m2).content, m2);
}

}  // namespace
}  // namespace m3::text
