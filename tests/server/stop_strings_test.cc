#include "server/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

namespace m3::server {
namespace {

// Feeds `text` in pieces of the given sizes and returns (emitted text, matched stop).
std::pair<std::string, std::string> run(StopStringMatcher& m, const std::string& text,
                                        const std::vector<size_t>& cuts) {
  std::string out, matched;
  size_t pos = 0;
  for (size_t cut : cuts) {
    auto step = m.feed(std::string_view(text).substr(pos, cut));
    pos += cut;
    out += step.text;
    if (step.matched) matched = *step.matched;
  }
  if (pos < text.size()) {
    auto step = m.feed(std::string_view(text).substr(pos));
    out += step.text;
    if (step.matched) matched = *step.matched;
  }
  if (matched.empty()) out += m.flush();
  return {out, matched};
}

TEST(StopStrings, NoStopsPassesEverythingThrough) {
  StopStringMatcher m({}, false);
  EXPECT_FALSE(m.active());
  EXPECT_EQ(m.feed("hello").text, "hello");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, HoldsBackAPossiblePrefixAndReleasesIt) {
  StopStringMatcher m({"STOP"}, false);
  auto a = m.feed("abcST");
  EXPECT_EQ(a.text, "abc");
  EXPECT_FALSE(a.matched);
  auto b = m.feed("x");  // "STx" can no longer become STOP
  EXPECT_EQ(b.text, "STx");
  auto c = m.feed("S");
  EXPECT_EQ(c.text, "");
  EXPECT_EQ(m.flush(), "S");
}

TEST(StopStrings, MatchSplitAcrossDeltasTruncatesBeforeTheStop) {
  StopStringMatcher m({"</end>"}, false);
  EXPECT_EQ(m.feed("result: 4</e").text, "result: 4");
  auto step = m.feed("nd> trailing");
  EXPECT_EQ(step.text, "");
  ASSERT_TRUE(step.matched);
  EXPECT_EQ(*step.matched, "</end>");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.feed("more").text, "");  // the output is over
}

TEST(StopStrings, IncludeInOutputKeepsTheStopString) {
  StopStringMatcher m({"\n\n"}, true);
  auto step = m.feed("line one\n\nline two");
  EXPECT_EQ(step.text, "line one\n\n");
  EXPECT_EQ(*step.matched, "\n\n");
}

TEST(StopStrings, EarliestMatchWinsThenLongest) {
  StopStringMatcher m({"world", "lo w", "lo"}, false);
  auto step = m.feed("hello world");
  EXPECT_EQ(step.text, "hel");
  EXPECT_EQ(*step.matched, "lo w");
}

TEST(StopStrings, EveryChunkingGivesTheSameResult) {
  const std::string text = "The answer is 42. Observation: done. Observation: again";
  const std::vector<std::string> stops = {"Observation:", "answer is 43", "xyz"};
  StopStringMatcher whole(stops, false);
  auto expected = run(whole, text, {text.size()});
  EXPECT_EQ(expected.first, "The answer is 42. ");
  EXPECT_EQ(expected.second, "Observation:");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    size_t left = text.size();
    while (left > 0) {
      size_t cut = std::min<size_t>(left, 1 + rng() % 5);
      cuts.push_back(cut);
      left -= cut;
    }
    StopStringMatcher m(stops, false);
    EXPECT_EQ(run(m, text, cuts), expected) << "trial " << trial;
  }
}

TEST(StopStrings, MultiByteTextIsNeverSplitInsideACharacter) {
  // "é" is 2 bytes; the stop shares its first byte with "é" only through a full character.
  StopStringMatcher m({"éé!"}, false);
  auto a = m.feed("café");
  EXPECT_EQ(a.text, "caf");  // "é" could start "éé!"
  auto b = m.feed("x");
  EXPECT_EQ(b.text, "éx");
}

}  // namespace
}  // namespace m3::server
