// Streaming detokenization: feed generated ids one at a time and get the text they complete.
// The concatenation of everything push() and finish() return equals Tokenizer::decode of all the
// ids pushed (same skip_special_tokens), and every returned piece is valid UTF-8: bytes of a
// character split across tokens wait until the character is complete (or proven invalid).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace m3::text {

class IncrementalDetokenizer {
 public:
  // Throws m3::Error when the tokenizer's decoder cannot be decoded in pieces exactly (a Strip
  // of trailing characters after Fuse, say); no known chat model's tokenizer does that.
  IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens);

  // Returns the text that became final with this id (often empty while a character is split).
  std::string push(int32_t id);
  // Several ids at once (accepted speculative tokens); same result as pushing them in turn.
  std::string push(std::span<const int32_t> ids);
  // The text still held back (an incomplete character at the very end becomes U+FFFD, as in
  // a one-shot decode). The detokenizer starts over afterwards.
  std::string finish();

  // Ids pushed since the last piece of text was returned.
  size_t pending_tokens() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> pending_;  // ids since the last cut
  bool at_start_ = true;          // nothing has been returned yet
  bool in_byte_run_ = false;      // the last token decode keeps is a byte-fallback token
};

}  // namespace m3::text
