// Added tokens (tokenizer.json "added_tokens"): matched in the text before normalization (or, for
// `normalized` tokens, in the normalized text) and never split by BPE. Matching is leftmost-longest
// with the single_word / lstrip / rstrip rules of the Rust `tokenizers` library, and ids are
// assigned the way it assigns them on load.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "text/tokenizer/bpe.h"

namespace m3::text {

class Normalizer;

struct AddedToken {
  std::string content;
  // What id_to_token and decode give: the content, normalized for `normalized` tokens (as the
  // Rust library's reverse map holds it).
  std::string text;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// One piece of a split: a matched added token (token_id >= 0) or text to process further.
struct TextSegment {
  size_t begin = 0;
  size_t end = 0;
  int32_t token_id = -1;
};

class AddedVocabulary {
 public:
  // `normalizer` may be null; it rewrites the patterns of `normalized` tokens.
  static AddedVocabulary from_json(const nlohmann::json& added_tokens, const BpeModel& model,
                                   const Normalizer* normalizer, const std::string& where);

  // Splits `text` on the tokens that match the raw input (normalized == false) or, with
  // `normalized_patterns`, on those that match normalized text. Segments cover the text in order.
  void split(std::string_view text, bool normalized_patterns, std::vector<TextSegment>& out) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  const AddedToken* find_id(int32_t id) const;
  bool is_special_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Matcher {
    std::vector<std::string> patterns;
    std::vector<size_t> token_index;  // pattern -> index in tokens_
    // Patterns by first byte, longest first, so the first hit at a position is the longest.
    std::array<std::vector<uint32_t>, 256> by_first_byte;
    void build();
    // The leftmost-longest match starting at or after `from`; false when none.
    bool find(std::string_view text, size_t from, size_t* begin, size_t* end,
              size_t* token) const;
  };
  void find_matches(std::string_view text, const Matcher& matcher,
                    std::vector<TextSegment>& out) const;

  std::vector<AddedToken> tokens_;  // by id order of assignment, one entry per content
  StringMap<size_t> index_of_content_;
  std::vector<int32_t> index_of_id_;  // id -> index in tokens_, or -1
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_contents_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

}  // namespace m3::text
