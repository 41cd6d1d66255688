// Unsupported components and malformed tokenizer.json files fail at load time with a message that
// names the file, the component path and the offending type or field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace m3::text {
namespace {

using Json = nlohmann::json;

// A small valid byte-level BPE tokenizer.json.
Json valid_spec() {
  return Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 5, "content": "<s>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
                       "use_regex": true},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
              "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4},
              "merges": [["a", "b"], ["\u0120", "ab"]]}
  })");
}

// The m3::Error message of loading `spec`, or "" when it loads.
std::string load_error(const Json& spec, const std::string& config = "") {
  try {
    Tokenizer::from_json_text(spec.dump(), config, "model/tokenizer.json");
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

std::string load_error_text(const std::string& text) {
  try {
    Tokenizer::from_json_text(text, "", "model/tokenizer.json");
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_MESSAGE_HAS(message, ...)                                      \
  do {                                                                        \
    const std::string m3_message = (message);                                 \
    for (const char* part : {__VA_ARGS__}) {                                  \
      EXPECT_NE(m3_message.find(part), std::string::npos)                     \
          << "message \"" << m3_message << "\" lacks \"" << part << "\"";     \
    }                                                                         \
  } while (0)

TEST(TokenizerLoad, ValidSpecLoadsAndEncodes) {
  const auto tokenizer = Tokenizer::from_json_text(valid_spec().dump(), "", "test");
  EXPECT_EQ(tokenizer.encode("ab ab<s>", false), (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{2, 4, 5}, true), "ab ab");
}

TEST(TokenizerLoad, RejectsUnsupportedComponents) {
  struct Case {
    const char* field;
    Json value;
    std::vector<const char*> expected;
  };
  const std::vector<Case> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}, {"model/tokenizer.json", "normalizer",
                                                    "BertNormalizer"}},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}},
                                                             {{"type", "Precompiled"}}}}},
       {"normalizer.normalizers[1]", "Precompiled"}},
      {"pre_tokenizer", {{"type", "Metaspace"}}, {"pre_tokenizer", "Metaspace"}},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}},
       {"pre_tokenizer.pretokenizers[0]", "Whitespace"}},
      {"decoder", {{"type", "WordPiece"}}, {"decoder", "WordPiece"}},
      {"post_processor", {{"type", "Unknown"}}, {"post_processor", "Unknown"}},
  };
  for (const auto& c : cases) {
    Json spec = valid_spec();
    spec[c.field] = c.value;
    const std::string message = load_error(spec);
    ASSERT_FALSE(message.empty()) << c.value.dump();
    for (const char* part : c.expected) {
      EXPECT_NE(message.find(part), std::string::npos) << message << " lacks " << part;
    }
  }
}

TEST(TokenizerLoad, RejectsUnsupportedModels) {
  Json spec = valid_spec();
  spec["model"]["type"] = "WordPiece";
  EXPECT_MESSAGE_HAS(load_error(spec), "model", "WordPiece", "BPE only");
  spec = valid_spec();
  spec["model"]["dropout"] = 0.1;
  EXPECT_MESSAGE_HAS(load_error(spec), "model", "dropout");
  spec = valid_spec();
  spec["model"]["dropout"] = 0.0;  // zero dropout is deterministic: accepted
  EXPECT_EQ(load_error(spec), "");
}

TEST(TokenizerLoad, RejectsMalformedFields) {
  EXPECT_MESSAGE_HAS(load_error_text("{not json"), "model/tokenizer.json", "not valid JSON");
  EXPECT_MESSAGE_HAS(load_error_text("[1, 2]"), "must be a JSON object");

  Json spec = valid_spec();
  spec.erase("model");
  EXPECT_MESSAGE_HAS(load_error(spec), "missing field 'model'");

  spec = valid_spec();
  spec["version"] = "2.0";
  EXPECT_MESSAGE_HAS(load_error(spec), "version", "2.0");

  spec = valid_spec();
  spec["model"]["merges"].push_back(Json::array({"a", "zz"}));
  EXPECT_MESSAGE_HAS(load_error(spec), "merges[2]", "zz", "not in the vocab");

  spec = valid_spec();
  spec["model"]["merges"] = Json::array({"a b c"});
  EXPECT_MESSAGE_HAS(load_error(spec), "merges[0]", "exactly two tokens");

  spec = valid_spec();
  spec["model"]["vocab"]["bad"] = -3;
  EXPECT_MESSAGE_HAS(load_error(spec), "vocab entry", "bad", "invalid id");

  spec = valid_spec();
  spec["model"].erase("vocab");
  EXPECT_MESSAGE_HAS(load_error(spec), "model", "missing field 'vocab'");

  spec = valid_spec();
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_MESSAGE_HAS(load_error(spec), "pre_tokenizer", "(unclosed", "does not compile");

  spec = valid_spec();
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Glob", "*"}}},
                           {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_MESSAGE_HAS(load_error(spec), "pre_tokenizer", "Glob");

  spec = valid_spec();
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}},
                           {"behavior", "Sideways"}, {"invert", false}};
  EXPECT_MESSAGE_HAS(load_error(spec), "pre_tokenizer", "behavior", "Sideways");

  spec = valid_spec();
  spec["pre_tokenizer"]["use_regex"] = "yes";
  EXPECT_MESSAGE_HAS(load_error(spec), "pre_tokenizer", "use_regex", "true or false");

  spec = valid_spec();
  spec["added_tokens"] = Json::object();
  EXPECT_MESSAGE_HAS(load_error(spec), "added_tokens", "array");

  spec = valid_spec();
  spec["added_tokens"][0].erase("content");
  EXPECT_MESSAGE_HAS(load_error(spec), "added_tokens[0]", "content");

  spec = valid_spec();
  spec["post_processor"] = {{"type", "TemplateProcessing"},
                            {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}}},
                            {"special_tokens", Json::object()}};
  EXPECT_MESSAGE_HAS(load_error(spec), "post_processor.single[0]", "<bos>");

  spec = valid_spec();
  spec["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  EXPECT_MESSAGE_HAS(load_error(spec), "decoder", "single character");

  EXPECT_MESSAGE_HAS(load_error(valid_spec(), "{\"bos_token\": 7}"), "tokenizer_config.json",
                     "bos_token");
}

TEST(TokenizerLoad, MissingFileNamesThePath) {
  try {
    Tokenizer::load("tests/text_tokenizer/no_such_model");
    FAIL() << "loading a missing tokenizer must fail";
  } catch (const m3::Error& e) {
    EXPECT_MESSAGE_HAS(std::string(e.what()), "no_such_model/tokenizer.json", "not found");
  }
}

TEST(TokenizerLoad, AddedTokenIdsFollowTheReferenceRule) {
  // The Rust library ignores ids written in the file: a token not in the vocab takes the next
  // id after the vocab (here 5 entries), whatever the file says.
  Json spec = valid_spec();
  spec["added_tokens"][0]["id"] = 42;
  const auto tokenizer = Tokenizer::from_json_text(spec.dump(), "", "test");
  EXPECT_EQ(tokenizer.token_to_id("<s>"), 5);
  EXPECT_EQ(tokenizer.vocab_size(), 6);
}

TEST(IncrementalDetokenizer, RejectsDecodersThatCannotStream) {
  Json spec = valid_spec();
  spec["decoder"] = {{"type", "Sequence"},
                     {"decoders", {{{"type", "ByteLevel"}},
                                   {{"type", "Strip"}, {"content", " "}, {"start", 0},
                                    {"stop", 1}}}}};
  const auto tokenizer = Tokenizer::from_json_text(spec.dump(), "", "test");
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{2, 3}, false), "ab");  // one-shot still works
  try {
    IncrementalDetokenizer detokenizer(tokenizer, false);
    FAIL() << "a trailing Strip after ByteLevel cannot be streamed exactly";
  } catch (const m3::Error& e) {
    EXPECT_MESSAGE_HAS(std::string(e.what()), "Strip", "stop");
  }
}

}  // namespace
}  // namespace m3::text
