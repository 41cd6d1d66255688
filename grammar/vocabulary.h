// The model's vocabulary as the grammar engine sees it: each token's bytes (the text it adds to
// the output), the end-of-sequence ids, and views for mask computation: a trie of every token
// and, per text class (grammar/text_class.h), the class's tokens as bitsets by length and a trie
// of the tokens outside it. Tokens without bytes (special tokens whose text the client will not
// see, unknown ids, empty tokens) are never allowed by a grammar; the eos ids are allowed exactly
// where the grammar's text is complete.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "grammar/text_class.h"
#include "grammar/token_trie.h"

namespace m3::grammar {

class Vocabulary {
 public:
  // tokens[i]: the bytes of token i, or nullopt. eos_ids: the ids that end the sequence.
  Vocabulary(const std::vector<std::optional<std::string>>& tokens, std::vector<int32_t> eos_ids);

  int32_t size() const { return size_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::optional<std::string>& bytes(int32_t token) const { return tokens_[static_cast<size_t>(token)]; }

  // Every token with bytes.
  const TokenTrie& trie() const { return trie_; }
  // The tokens with bytes that are not of the class with at most kMaxClassChars characters.
  const TokenTrie& outside(TextClass cls) const { return classes_[index(cls)].outside; }
  // The tokens of the class with 1..chars characters, as a mask (token_mask_words(size())
  // words), and how many they are.
  std::span<const uint32_t> class_upto(TextClass cls, int32_t chars) const {
    return {classes_[index(cls)].upto.data() + static_cast<size_t>(chars) * words_, words_};
  }
  int64_t class_count_upto(TextClass cls, int32_t chars) const {
    return classes_[index(cls)].count_upto[static_cast<size_t>(chars)];
  }

 private:
  static size_t index(TextClass cls) { return static_cast<size_t>(cls); }
  struct ClassTokens {
    TokenTrie outside;
    std::vector<uint32_t> upto;       // kMaxClassChars + 1 masks of words_ words
    std::vector<int64_t> count_upto;  // kMaxClassChars + 1 counts
  };
  int32_t size_ = 0;
  size_t words_ = 0;
  std::vector<std::optional<std::string>> tokens_;
  std::vector<int32_t> eos_ids_;
  TokenTrie trie_;
  std::array<ClassTokens, kNumTextClasses> classes_;
};

}  // namespace m3::grammar
