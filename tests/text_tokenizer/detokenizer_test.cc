// Streaming detokenization on the bundled tokenizer: characters split across byte-level tokens
// are held back until complete, special tokens follow skip_special_tokens, and the pieces add up
// to the one-shot decode.
#include <gtest/gtest.h>

#include "tests/text_tokenizer/fixture_util.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace m3::text {
namespace {

const auto kBundledDir = testing::kFixtureRoot / "minimax_bundled";

// Ids of the single byte-level tokens of `bytes` (every byte is in a byte-level vocab).
std::vector<int32_t> byte_tokens(const Tokenizer& tokenizer, const std::string& bytes) {
  static const auto byte_char = [](unsigned char b) {
    // GPT-2's table: printable Latin-1 bytes stand for themselves, the rest for U+0100 onward.
    int next = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      if (c == b) return printable ? c : 256 + next;
      if (!printable) ++next;
    }
    return -1;
  };
  std::vector<int32_t> ids;
  for (unsigned char b : bytes) {
    const int c = byte_char(b);
    std::string utf8;
    if (c < 0x80) {
      utf8.push_back(static_cast<char>(c));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (c >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    ids.push_back(*tokenizer.token_to_id(utf8));
  }
  return ids;
}

TEST(IncrementalDetokenizer, HoldsSplitCharactersUntilComplete) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  const std::string text = "a\xF0\x9F\x91\x8D\xE4\xB8\xAD!";  // a 👍 中 !
  const auto ids = byte_tokens(tokenizer, text);
  ASSERT_EQ(ids.size(), text.size());
  IncrementalDetokenizer detokenizer(tokenizer, false);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(detokenizer.push(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x91\x8D", "", "",
                                              "\xE4\xB8\xAD", "!"}));
  EXPECT_EQ(detokenizer.finish(), "");
}

TEST(IncrementalDetokenizer, InvalidBytesBecomeReplacementCharactersLikeOneShot) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  // A cut emoji followed by text, a lone continuation byte, then a cut character at the end.
  const std::string bytes = "\xF0\x9F\x91x\x80y\xE4\xB8";
  const auto ids = byte_tokens(tokenizer, bytes);
  IncrementalDetokenizer detokenizer(tokenizer, false);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string piece = detokenizer.push(id);
    EXPECT_TRUE(testing::is_valid_utf8(piece));
    streamed += piece;
  }
  EXPECT_EQ(streamed, "\xEF\xBF\xBDx\xEF\xBF\xBDy");  // the cut tail is still held
  EXPECT_EQ(detokenizer.pending_tokens(), 2u);
  streamed += detokenizer.finish();
  EXPECT_EQ(streamed, tokenizer.decode(ids, false));
  EXPECT_EQ(streamed, "\xEF\xBF\xBDx\xEF\xBF\xBDy\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, SkipsOrKeepsSpecialTokens) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  const auto ids = tokenizer.encode("<mm:think>plan</mm:think>Answer[e~[", false);
  for (const bool skip : {false, true}) {
    IncrementalDetokenizer detokenizer(tokenizer, skip);
    std::string streamed = detokenizer.push(ids);
    streamed += detokenizer.finish();
    EXPECT_EQ(streamed, skip ? "planAnswer" : "<mm:think>plan</mm:think>Answer[e~[");
  }
}

TEST(IncrementalDetokenizer, FinishStartsOver) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  IncrementalDetokenizer detokenizer(tokenizer, false);
  const auto first = tokenizer.encode("first", false);
  const auto second = tokenizer.encode(" second", false);
  std::string text = detokenizer.push(first);
  text += detokenizer.finish();
  EXPECT_EQ(text, "first");
  text = detokenizer.push(second);
  text += detokenizer.finish();
  EXPECT_EQ(text, " second");
}

TEST(IncrementalDetokenizer, LeadingStripAppliesOnceToTheWholeText) {
  // Llama-style decoders strip one leading space of the whole text, not of each streamed piece.
  const auto tokenizer = Tokenizer::load(testing::kFixtureRoot / "llama_byte_fallback");
  const auto ids = tokenizer.encode("Hello world, hello again", false);
  IncrementalDetokenizer detokenizer(tokenizer, false);
  std::string streamed;
  for (const int32_t id : ids) streamed += detokenizer.push(id);
  streamed += detokenizer.finish();
  EXPECT_EQ(streamed, "Hello world, hello again");
  EXPECT_EQ(streamed, tokenizer.decode(ids, false));
}

}  // namespace
}  // namespace m3::text
