#include "text/reasoning_parser.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "stream_harness.h"

namespace m3::text {
namespace {

ReasoningSplit parse(std::string_view name, std::string_view text, ReasoningOptions options = {}) {
  return ReasoningParser(name, options).parse(text);
}

void expect_split(const ReasoningSplit& split, std::string_view reasoning, std::string_view content) {
  EXPECT_EQ(split.reasoning, reasoning);
  EXPECT_EQ(split.content, content);
}

TEST(ReasoningParser, M3SplitsReasoningAndContent) {
  expect_split(parse("minimax_m3", "<mm:think>Let me think.</mm:think>The answer is 4."), "Let me think.",
               "The answer is 4.");
}

TEST(ReasoningParser, M3WithoutOpenerIsAllContent) {
  expect_split(parse("minimax_m3", "Just an answer."), "", "Just an answer.");
  expect_split(parse("minimax_m3", "Just an answer.", {"adaptive", {}}), "", "Just an answer.");
}

TEST(ReasoningParser, M3JoinsContentBeforeAndAfterTheBlock) {
  expect_split(parse("minimax_m3", "\n\n<mm:think>r</mm:think>\nanswer"), "r", "\n\n\nanswer");
}

TEST(ReasoningParser, M3EnabledModeStartsInsideReasoning) {
  expect_split(parse("minimax_m3", "step 1, step 2</mm:think>Done.", {"enabled", {}}), "step 1, step 2", "Done.");
  // Never closed: all reasoning.
  expect_split(parse("minimax_m3", "still thinking", {"enabled", {}}), "still thinking", "");
  // The pre-filled opener generated again is dropped.
  expect_split(parse("minimax_m3", "<mm:think>r</mm:think>c", {"enabled", {}}), "r", "c");
  // Empty reasoning.
  expect_split(parse("minimax_m3", "</mm:think>c", {"enabled", {}}), "", "c");
}

TEST(ReasoningParser, M3PromptStateOverridesThinkingMode) {
  expect_split(parse("minimax_m3", "r</mm:think>c", {"", true}), "r", "c");
  expect_split(parse("minimax_m3", "r</mm:think>c", {"enabled", false}), "", "r</mm:think>c");
}

TEST(ReasoningParser, M3DropsOnlyALeadingStrayCloser) {
  expect_split(parse("minimax_m3", "</mm:think>Hello"), "", "Hello");
  expect_split(parse("minimax_m3", "</mm:think>Hello", {"disabled", {}}), "", "Hello");
  // After a stray closer everything is content, markers included.
  expect_split(parse("minimax_m3", "</mm:think>a<mm:think>b</mm:think>"), "", "a<mm:think>b</mm:think>");
  // A closer that is not at the very start stays visible.
  expect_split(parse("minimax_m3", "Hello</mm:think>world"), "", "Hello</mm:think>world");
}

TEST(ReasoningParser, M3LaterMarkersAreContent) {
  expect_split(parse("minimax_m3", "<mm:think>a</mm:think>b<mm:think>c</mm:think>"), "a",
               "b<mm:think>c</mm:think>");
  // Inside reasoning an opener is reasoning text; the first closer ends it.
  expect_split(parse("minimax_m3", "<mm:think>a<mm:think>b</mm:think>c"), "a<mm:think>b", "c");
}

TEST(ReasoningParser, M3UnclosedReasoningStaysReasoning) {
  expect_split(parse("minimax_m3", "intro <mm:think>thinking..."), "thinking...", "intro ");
}

TEST(ReasoningParser, M3PartialMarkersAtTheEndAreText) {
  expect_split(parse("minimax_m3", "answer <mm:thi"), "", "answer <mm:thi");
  expect_split(parse("minimax_m3", "</mm:thi"), "", "</mm:thi");
  expect_split(parse("minimax_m3", "<mm:think>r</mm:th"), "r</mm:th", "");
}

TEST(ReasoningParser, StreamingHoldsBackOnlyAPossibleMarker) {
  ReasoningParser parser("minimax_m3");
  DeltaMessage d = parser.feed("<mm:th");
  EXPECT_TRUE(d.empty());
  d = parser.feed("ink>I think <b>bold</b> ");
  EXPECT_EQ(d.reasoning_delta, "I think <b>bold</b> ");
  d = parser.feed("so.</");
  EXPECT_EQ(d.reasoning_delta, "so.");
  d = parser.feed("mm:");
  EXPECT_TRUE(d.empty());
  EXPECT_FALSE(parser.reasoning_ended());
  d = parser.feed("think>Answer <");
  EXPECT_EQ(d.reasoning_delta, "");
  EXPECT_EQ(d.content_delta, "Answer <");  // past reasoning nothing is held back
  EXPECT_TRUE(parser.reasoning_ended());
  d = parser.finish();
  EXPECT_TRUE(d.empty());
}

TEST(ReasoningParser, StreamingReleasesAFalseMarkerStart) {
  ReasoningParser parser("minimax_m3");
  EXPECT_TRUE(parser.feed("<").empty());
  const DeltaMessage d = parser.feed("p>hi");
  EXPECT_EQ(d.content_delta, "<p>hi");
}

TEST(ReasoningParser, M2StartsInsideReasoning) {
  expect_split(parse("minimax_m2", "\nreasoning\n</think>\n\nanswer"), "\nreasoning\n", "\n\nanswer");
  expect_split(parse("minimax_m2", "<think>r</think>c"), "r", "c");
  expect_split(parse("minimax_m2", "no end marker"), "no end marker", "");
  expect_split(parse("minimax_m2", "a</think>b", {"", false}), "", "a</think>b");
  expect_split(parse("minimax_m2", "x<think>a</think>b", {"", false}), "a", "xb");
}

TEST(ReasoningParser, M2AppendThinkPrependsTheOpener) {
  expect_split(parse("minimax_m2_append_think", "r</think>c"), "", "<think>r</think>c");
  expect_split(parse("minimax_m2_append_think", ""), "", "<think>");
  ReasoningParser parser("minimax_m2_append_think");
  EXPECT_EQ(parser.feed("a").content_delta, "<think>a");
  EXPECT_EQ(parser.feed("b").content_delta, "b");
  EXPECT_TRUE(parser.finish().empty());
}

TEST(ReasoningParser, PromptEndsInReasoningLooksOnlyAtTheEnd) {
  // The M3 system prompt quotes both markers; only the generation prompt's end matters.
  const std::string system = "wrap your reasoning in <mm:think></mm:think> tags";
  EXPECT_FALSE(ReasoningParser::prompt_ends_in_reasoning("minimax_m3", system + "]~b]ai\n"));
  EXPECT_TRUE(ReasoningParser::prompt_ends_in_reasoning("minimax_m3", system + "]~b]ai\n<mm:think>"));
  EXPECT_FALSE(ReasoningParser::prompt_ends_in_reasoning("minimax_m3", system + "]~b]ai\n</mm:think>"));
  EXPECT_TRUE(ReasoningParser::prompt_ends_in_reasoning("minimax_m2", "]~b]ai\n<think>\n"));
  EXPECT_FALSE(ReasoningParser::prompt_ends_in_reasoning("minimax_m2_append_think", "<think>\n"));
}

TEST(ReasoningParser, RejectsUnknownNamesAndModes) {
  try {
    ReasoningParser parser("deepseek_r1");
    FAIL() << "no error";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("minimax_m3, minimax_m2, minimax_m2_append_think"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ReasoningParser("minimax_m3", {"on", {}}), m3::Error);
  EXPECT_THROW(ReasoningParser::prompt_ends_in_reasoning("qwen3", ""), m3::Error);
}

TEST(ReasoningParser, ParseNeedsAFreshParserAndFinishEndsInput) {
  ReasoningParser parser("minimax_m3");
  parser.feed("a");
  EXPECT_THROW(parser.parse("b"), m3::Error);
  parser.finish();
  EXPECT_THROW(parser.feed("c"), m3::Error);
}

// Streaming in every chunking gives exactly the non-streaming split.
struct ReasoningCase {
  std::string parser;
  std::string thinking_mode;
  std::string text;
};

TEST(ReasoningParser, StreamingEqualsParseInEveryChunking) {
  std::vector<ReasoningCase> cases;
  auto add = [&](std::string parser, std::string mode, std::string text) {
    cases.push_back({std::move(parser), std::move(mode), std::move(text)});
  };
  add("minimax_m3", "", "<mm:think>Let me see: 2+2 = 4 </mm: not yet</mm:think>It is **4**.");
  add("minimax_m3", "", "</mm:think>Hello <mm:think> there");
  add("minimax_m3", "", "</mm:thin");
  add("minimax_m3", "", "<<mm:think>>x</</mm:think>>");
  add("minimax_m3", "", "前言<mm:think>思考：日本語と中文 🙂</mm:think>答え🙂");
  add("minimax_m3", "enabled", "<mm:think>dup</mm:think>c");
  add("minimax_m3", "enabled", "<mm:thinking is not the marker</mm:think></mm:think>");
  add("minimax_m3", "disabled", "</mm:think></mm:think>x");
  add("minimax_m2", "", "\nthink\n</think>\n\ncontent </think>");
  add("minimax_m2", "", "<think>a</thin");
  add("minimax_m2_append_think", "", "a</think>b");
  for (const ReasoningCase& c : cases) {
    const ReasoningOptions options{c.thinking_mode, std::nullopt};
    const ReasoningSplit expected = ReasoningParser(c.parser, options).parse(c.text);
    for (const auto& chunking : testing::all_chunkings(c.text)) {
      const ReasoningSplit got = testing::stream_reasoning(c.parser, options, chunking.chunks);
      ASSERT_EQ(got.reasoning, expected.reasoning) << c.text << " / " << chunking.label;
      ASSERT_EQ(got.content, expected.content) << c.text << " / " << chunking.label;
    }
  }
}

}  // namespace
}  // namespace m3::text
