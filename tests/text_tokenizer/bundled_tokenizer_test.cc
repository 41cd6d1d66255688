// The bundled model's tokenizer: 8192 ids, every MiniMax-M3 special token (docs/reference.md
// 5.1) as a special added token, the special tokens named by
// tokenizer_config.json, and the public Tokenizer API on it.
#include <gtest/gtest.h>

#include <thread>

#include "tests/text_tokenizer/fixture_util.h"
#include "text/tokenizer.h"

namespace m3::text {
namespace {

const auto kBundledDir = testing::kFixtureRoot / "minimax_bundled";

const std::vector<std::string> kMiniMaxSpecials = {
    "]!p~[", "]~b]", "[e~[", "]!d~[", "]<]image[>[", "]<]video[>[", "]<]start of image[>[",
    "]<]end of image[>[", "]<]vision pad[>[", "]~!b[", "<think>", "</think>",
    "<minimax:tool_call>", "</minimax:tool_call>", "]<]noise[>[", "<mm:think>", "</mm:think>",
    "]<]minimax[>[",
};

TEST(BundledTokenizer, HasEveryMiniMaxSpecialTokenAtTheEnd) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  ASSERT_EQ(tokenizer.vocab_size(), 8192);
  int32_t expected_id = 8192 - static_cast<int32_t>(kMiniMaxSpecials.size());
  for (const auto& special : kMiniMaxSpecials) {
    const auto id = tokenizer.token_to_id(special);
    ASSERT_TRUE(id.has_value()) << special;
    EXPECT_EQ(*id, expected_id++) << special;
    EXPECT_TRUE(tokenizer.is_special(*id)) << special;
    EXPECT_EQ(tokenizer.id_to_token(*id), special);
    // Written inside text, a marker is one token, never split by BPE.
    EXPECT_EQ(tokenizer.encode("x" + special + "y", false).size(), 3u) << special;
  }
  EXPECT_FALSE(tokenizer.is_special(*tokenizer.token_to_id("a")));
  EXPECT_FALSE(tokenizer.id_to_token(8192).has_value());
  EXPECT_FALSE(tokenizer.id_to_token(-1).has_value());
}

TEST(BundledTokenizer, ReadsTokenizerConfig) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  EXPECT_EQ(tokenizer.special_tokens().bos, "]~!b[");
  EXPECT_EQ(tokenizer.special_tokens().eos, "[e~[");
  EXPECT_EQ(tokenizer.special_tokens().pad, "]!p~[");
  EXPECT_FALSE(tokenizer.special_tokens().unk.has_value());
  EXPECT_EQ(tokenizer.bos_token_id(), tokenizer.token_to_id("]~!b["));
  EXPECT_EQ(tokenizer.eos_token_id(), tokenizer.token_to_id("[e~["));
  EXPECT_EQ(tokenizer.pad_token_id(), tokenizer.token_to_id("]!p~["));
  EXPECT_EQ(tokenizer.model_max_length(), 1048576);
  EXPECT_EQ(tokenizer.tokenizer_config().value("clean_up_tokenization_spaces", true), false);
  EXPECT_FALSE(tokenizer.tokenizer_config().contains("chat_template"));
}

TEST(BundledTokenizer, ChatTurnRoundTrips) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  const std::string turn =
      "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nWhat is 2+2? 你好 👋[e~[\n"
      "]~b]ai\n<mm:think>Add them.</mm:think>4[e~[";
  const auto ids = tokenizer.encode(turn, true);  // the ByteLevel post-processor adds nothing
  EXPECT_EQ(ids, tokenizer.encode(turn, false));
  EXPECT_EQ(ids.front(), *tokenizer.bos_token_id());
  EXPECT_EQ(ids.back(), *tokenizer.eos_token_id());
  EXPECT_EQ(tokenizer.decode(ids, false), turn);
  EXPECT_EQ(tokenizer.decode(ids, true),
            "system\nYou are a helpful assistant.\nuser\nWhat is 2+2? 你好 👋\nai\nAdd them.4");
}

TEST(BundledTokenizer, CopiesShareAndEncodeConcurrently) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  std::string text;
  const auto golden = testing::read_json(kBundledDir / "golden.json");
  for (int i = 0; i < 20; ++i) {
    for (const auto& c : golden["cases"]) text += testing::case_input(c);
  }
  const auto expected = tokenizer.encode(text, false);
  ASSERT_GT(expected.size(), 1000u);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([copy = tokenizer, &result, &text] { result = copy.encode(text, false); });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(BundledTokenizer, InvalidUtf8IsReplacedLikePython) {
  const auto tokenizer = Tokenizer::load(kBundledDir);
  // bytes.decode("utf-8", "replace") gives one U+FFFD per maximal invalid subsequence.
  EXPECT_EQ(tokenizer.encode("a\xE4\xB8 b\xFF", false),
            tokenizer.encode("a\xEF\xBF\xBD b\xEF\xBF\xBD", false));
  EXPECT_EQ(tokenizer.encode("\xF0\x9F\x98", false), tokenizer.encode("\xEF\xBF\xBD", false));
  EXPECT_EQ(tokenizer.encode("\xED\xA0\x80", false),
            tokenizer.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", false));
}

}  // namespace
}  // namespace m3::text
