#include "text/detokenizer.h"

#include "core/error.h"

namespace m3::text {

namespace {

bool ends_with_replacement_char(const std::string& text) {
  return text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {
  M3_CHECK(tokenizer_.streaming_obstacle().empty(),
           "this tokenizer cannot be detokenized incrementally: {}",
           tokenizer_.streaming_obstacle());
}

std::string IncrementalDetokenizer::push(int32_t id) {
  pending_.push_back(id);
  // A cut is exact only where the decoder's cross-token state is empty: not inside a run of
  // byte-fallback tokens, not after an incomplete UTF-8 sequence (whose U+FFFD would end the
  // text), and after some text (so a Strip of the start has found what it strips).
  // Ids that decode leaves out do not end a run of byte tokens.
  if (!tokenizer_.decode_drops(id, skip_special_tokens_)) {
    in_byte_run_ = tokenizer_.decoder_may_join_next(id);
  }
  if (in_byte_run_) return {};
  std::string text =
      tokenizer_.decode_continuation(pending_, skip_special_tokens_, /*continuation=*/!at_start_);
  if (text.empty() || ends_with_replacement_char(text)) return {};
  pending_.clear();
  at_start_ = false;
  return text;
}

std::string IncrementalDetokenizer::push(std::span<const int32_t> ids) {
  std::string text;
  for (const int32_t id : ids) text += push(id);
  return text;
}

std::string IncrementalDetokenizer::finish() {
  std::string text =
      tokenizer_.decode_continuation(pending_, skip_special_tokens_, /*continuation=*/!at_start_);
  pending_.clear();
  at_start_ = true;
  in_byte_run_ = false;
  return text;
}

}  // namespace m3::text
