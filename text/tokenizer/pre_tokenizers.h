// tokenizer.json "pre_tokenizer": ByteLevel, Split, Digits and Sequence, with the split
// behaviours of the Rust `tokenizers` library (Removed, Isolated, MergedWithPrevious,
// MergedWithNext, Contiguous, and `invert`).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace m3::text {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces, in order; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// Null gives nullptr; unknown types and malformed fields throw m3::Error naming `where`.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& where);

}  // namespace m3::text
