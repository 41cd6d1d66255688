// Every golden tokenizer encodes and decodes its corpus exactly as the Hugging Face `tokenizers`
// library did (tools/make_tokenizer_golden.py), and the incremental detokenizer reproduces the
// one-shot decode piece by piece.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/text_tokenizer/fixture_util.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace m3::text {
namespace {

using testing::case_input;
using testing::kFixtureRoot;
using testing::kGoldenFixtures;

class GoldenTokenizer : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto dir = kFixtureRoot / GetParam();
    golden_ = testing::read_json(dir / "golden.json");
    tokenizer_.emplace(Tokenizer::load(dir));
  }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  // Streams `ids` one at a time (or `chunk` at a time) and checks every returned piece.
  std::string stream(const std::vector<int32_t>& ids, bool skip_special, size_t chunk = 1) const {
    IncrementalDetokenizer detokenizer(tokenizer(), skip_special);
    std::string text;
    for (size_t i = 0; i < ids.size(); i += chunk) {
      const size_t n = std::min(chunk, ids.size() - i);
      const std::string piece =
          chunk == 1 ? detokenizer.push(ids[i])
                     : detokenizer.push(std::span<const int32_t>(ids.data() + i, n));
      EXPECT_TRUE(testing::is_valid_utf8(piece)) << "invalid UTF-8 piece after id " << i;
      text += piece;
    }
    const std::string rest = detokenizer.finish();
    EXPECT_TRUE(testing::is_valid_utf8(rest));
    return text + rest;
  }

  nlohmann::json golden_;
  std::optional<Tokenizer> tokenizer_;
};

TEST_P(GoldenTokenizer, EncodesLikeTheReference) {
  ASSERT_GE(golden_["cases"].size(), 40u);
  for (const auto& c : golden_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string input = case_input(c);
    EXPECT_EQ(tokenizer().encode(input, false), c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer().encode(input, true), c["ids_with_special"].get<std::vector<int32_t>>());
    if (c.contains("tokens")) {
      std::vector<std::string> tokens;
      for (const int32_t id : c["ids"].get<std::vector<int32_t>>()) {
        tokens.push_back(tokenizer().id_to_token(id).value_or("<none>"));
      }
      EXPECT_EQ(tokens, c["tokens"].get<std::vector<std::string>>());
    }
  }
}

TEST_P(GoldenTokenizer, DecodesLikeTheReference) {
  for (const auto& c : golden_["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto ids = c["ids_with_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer().decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(tokenizer().decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
  ASSERT_GE(golden_["decode_cases"].size(), 20u);
  for (const auto& c : golden_["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(c["ids"].dump());
    EXPECT_EQ(tokenizer().decode(ids, false), c["decoded"].get<std::string>());
    EXPECT_EQ(tokenizer().decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
}

TEST_P(GoldenTokenizer, IncrementalDecodeEqualsOneShot) {
  std::vector<std::vector<int32_t>> sequences;
  for (const auto& c : golden_["cases"]) {
    sequences.push_back(c["ids_with_special"].get<std::vector<int32_t>>());
  }
  for (const auto& c : golden_["decode_cases"]) sequences.push_back(c["ids"]);
  size_t index = 0;
  for (const auto& ids : sequences) {
    SCOPED_TRACE("sequence " + std::to_string(index++));
    for (const bool skip : {false, true}) {
      const std::string expected = tokenizer().decode(ids, skip);
      EXPECT_EQ(stream(ids, skip), expected) << "skip_special_tokens=" << skip;
      EXPECT_EQ(stream(ids, skip, 3), expected) << "3 ids per push";
    }
  }
}

TEST_P(GoldenTokenizer, IncrementalDecodeOfEveryPrefix) {
  // A stream stopped anywhere (max_tokens, a stop string) ends with the decode of what it got.
  for (const auto& c : golden_["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    for (size_t n = 0; n <= ids.size(); ++n) {
      const std::vector<int32_t> prefix(ids.begin(), ids.begin() + n);
      EXPECT_EQ(stream(prefix, false), tokenizer().decode(prefix, false)) << c["ids"].dump();
    }
  }
}

TEST_P(GoldenTokenizer, VocabSizeMatches) {
  EXPECT_EQ(tokenizer().vocab_size(), golden_["vocab_size"].get<int32_t>());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTokenizer, ::testing::ValuesIn(kGoldenFixtures),
                         [](const auto& info) { return info.param; });

TEST(GoldenFixtures, CameFromTheReferenceLibrary) {
  for (const auto& name : kGoldenFixtures) {
    const auto golden = testing::read_json(kFixtureRoot / name / "golden.json");
    EXPECT_TRUE(golden.contains("tokenizers_version")) << name;
  }
}

}  // namespace
}  // namespace m3::text
