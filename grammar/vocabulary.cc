#include "grammar/vocabulary.h"

#include <future>

namespace m3::grammar {

Vocabulary::Vocabulary(const std::vector<std::optional<std::string>>& tokens, std::vector<int32_t> eos_ids)
    : size_(static_cast<int32_t>(tokens.size())),
      words_(static_cast<size_t>((size_ + 31) / 32)),
      tokens_(tokens),
      eos_ids_(std::move(eos_ids)) {
  for (int32_t id : eos_ids_)
    if (id >= 0 && id < size_) tokens_[static_cast<size_t>(id)].reset();  // eos adds no text
  std::vector<int32_t> with_bytes;
  for (int32_t i = 0; i < size_; ++i)
    if (tokens_[static_cast<size_t>(i)] && !tokens_[static_cast<size_t>(i)]->empty()) with_bytes.push_back(i);
  std::array<std::vector<int32_t>, kNumTextClasses> outside;
  for (int32_t c = 0; c < kNumTextClasses; ++c) {
    const auto cls = static_cast<TextClass>(c);
    ClassTokens& out = classes_[static_cast<size_t>(c)];
    out.upto.assign(static_cast<size_t>(kMaxClassChars + 1) * words_, 0u);
    out.count_upto.assign(static_cast<size_t>(kMaxClassChars + 1), 0);
    for (int32_t id : with_bytes) {
      const int32_t chars = class_chars(cls, *tokens_[static_cast<size_t>(id)]);
      if (chars < 1 || chars > kMaxClassChars) {
        outside[static_cast<size_t>(c)].push_back(id);
        continue;
      }
      for (int32_t k = chars; k <= kMaxClassChars; ++k) {
        out.upto[static_cast<size_t>(k) * words_ + static_cast<size_t>(id >> 5)] |= 1u << (id & 31);
        ++out.count_upto[static_cast<size_t>(k)];
      }
    }
  }
  // The tries are independent reads of the tokens: built side by side, the largest here.
  std::array<std::future<TokenTrie>, kNumTextClasses> tries;
  for (size_t c = 0; c < tries.size(); ++c)
    tries[c] = std::async(std::launch::async, [this, ids = std::move(outside[c])]() mutable { return TokenTrie(tokens_, std::move(ids)); });
  trie_ = TokenTrie(tokens_, std::move(with_bytes));
  for (size_t c = 0; c < tries.size(); ++c) classes_[c].outside = tries[c].get();
}

}  // namespace m3::grammar
