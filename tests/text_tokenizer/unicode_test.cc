// The UTF-8 and Unicode helpers behind the tokenizer, against values from Python (the reference's
// host language) and the Unicode standard.
#include <gtest/gtest.h>

#include "text/tokenizer/regex.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {
namespace {

TEST(Utf8, ReplacesMaximalInvalidSubpartsLikePython) {
  // Expected values: bytes.decode("utf-8", "replace") in Python 3.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::to_valid_utf8("abc"), "abc");
  EXPECT_EQ(unicode::to_valid_utf8("\xFF\xFE"), r + r);
  EXPECT_EQ(unicode::to_valid_utf8("abc\xE4\xB8"), "abc" + r);
  EXPECT_EQ(unicode::to_valid_utf8("\xE2\x28\xA1"), r + "(" + r);
  EXPECT_EQ(unicode::to_valid_utf8("\xC0\xAF"), r + r);                // overlong
  EXPECT_EQ(unicode::to_valid_utf8("\xE0\x80\xAF"), r + r + r);        // overlong, 3 bytes
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), r + r + r);        // a surrogate
  EXPECT_EQ(unicode::to_valid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98z"), r + "z");
  EXPECT_EQ(unicode::to_valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_TRUE(unicode::is_valid_utf8("\xF0\x9F\x91\x8D\xE4\xB8\xAD"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xF0\x9F\x91"));
}

TEST(Unicode, CharacterClassesFollowRust) {
  for (char32_t c : {U'\t', U'\n', U' ', U'\u0085', U'\u00A0', U'\u2028', U'\u3000'}) {
    EXPECT_TRUE(unicode::is_white_space(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'\u180E', U'\u200B', U'\u001C', U'x'}) {
    EXPECT_FALSE(unicode::is_white_space(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'7', U'\u0661', U'\u00BD', U'\u2167', U'\u00B2'}) {
    EXPECT_TRUE(unicode::is_numeric(c)) << static_cast<uint32_t>(c);
  }
  EXPECT_FALSE(unicode::is_numeric(U'x'));
  for (char32_t c : {U'a', U'_', U'\u0301', U'\u200D', U'\u24B6', U'\u0661'}) {
    EXPECT_TRUE(unicode::is_word_char(c)) << static_cast<uint32_t>(c);
  }
  for (char32_t c : {U'-', U' ', U'\u00BD', U'\u2460'}) {
    EXPECT_FALSE(unicode::is_word_char(c)) << static_cast<uint32_t>(c);
  }
}

TEST(Unicode, NormalizesLineByLine) {
  using unicode::NormalForm;
  EXPECT_EQ(unicode::normalize("plain ascii\nline two", NormalForm::kNfc), "plain ascii\nline two");
  EXPECT_EQ(unicode::normalize("e\xCC\x81\ncafe\xCC\x81", NormalForm::kNfc),
            "\xC3\xA9\ncaf\xC3\xA9");
  EXPECT_EQ(unicode::normalize("\xC3\xA9", NormalForm::kNfd), "e\xCC\x81");
  EXPECT_EQ(unicode::normalize("\xEF\xAC\x81 \xE2\x91\xA0", NormalForm::kNfkc), "fi 1");
  EXPECT_EQ(unicode::normalize("\xC2\xBD", NormalForm::kNfkd), "1\xE2\x81\x84" "2");
  EXPECT_EQ(unicode::normalize("\xC2\xBD", NormalForm::kNfc), "\xC2\xBD");
  // Hangul: a syllable and a following trailing jamo compose; kana with a voicing mark too.
  EXPECT_EQ(unicode::normalize("\xEA\xB0\x80\xE1\x86\xA8", NormalForm::kNfc), "\xEA\xB0\x81");
  EXPECT_EQ(unicode::normalize("\xE3\x81\x8B\xE3\x82\x99", NormalForm::kNfc), "\xE3\x81\x8C");
}

TEST(Unicode, LowercasesLikeRust) {
  EXPECT_EQ(unicode::to_lowercase("HeLLo \xC3\x84\xCE\xA3"), "hello \xC3\xA4\xCF\x83");
  EXPECT_EQ(unicode::to_lowercase("\xC4\xB0"), "i\xCC\x87");  // İ has a two-character mapping
}

TEST(Regex, UsesOnigurumaClassesAndEmptyMatchRules) {
  const Regex space("\\s+", false, "test");
  auto spans = space.find_matches("a\xE1\xA0\x8E b");  // U+180E is not White_Space
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[1].begin, 4u);
  EXPECT_TRUE(spans[1].is_match);

  const Regex word("\\w+", false, "test");
  spans = word.find_matches("1\xEF\xB8\x8F\xE2\x83\xA3-");  // 1 + VS16 + keycap: marks are \w
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].end, 7u);

  const Regex hex("\\h+", false, "test");
  spans = hex.find_matches("xbeefx");
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[1].begin, 1u);
  EXPECT_EQ(spans[1].end, 5u);

  const Regex empty("", true, "test");  // an empty String pattern splits between characters
  spans = empty.find_matches("ab");
  std::vector<std::pair<size_t, size_t>> got;
  for (const auto& s : spans) got.emplace_back(s.begin, s.end);
  EXPECT_EQ(got, (std::vector<std::pair<size_t, size_t>>{{0, 0}, {0, 1}, {1, 1}, {1, 2}, {2, 2}}));

  const Regex literal("a.b", true, "test");
  EXPECT_EQ(literal.replace_all("a.b axb", "-"), "- axb");
  const Regex anchors("^x|y$", false, "test");
  EXPECT_EQ(anchors.replace_all("xay\nxby", "_"), "_a_\n_b_");
  EXPECT_EQ(anchors.replace_all("", "_"), "");
}

}  // namespace
}  // namespace m3::text
