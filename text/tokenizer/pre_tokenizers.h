// tokenizer.json "pre_tokenizer": ByteLevel, Split, Digits and Sequence, with the split
// behaviours of the Rust `tokenizers` library (Removed, Isolated, MergedWithPrevious,
// MergedWithNext, Contiguous, and `invert`).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::text {

// Pre-tokens stored back to back in one buffer (a 1M-token prompt makes hundreds of thousands of
// them; one allocation instead of one each).
class Pieces {
 public:
  size_t size() const { return spans_.size(); }
  std::string_view operator[](size_t i) const {
    return std::string_view(text_).substr(spans_[i].first, spans_[i].second);
  }
  void clear() {
    text_.clear();
    spans_.clear();
  }
  // Appends a piece; empty pieces are dropped, as the reference drops them.
  void add(std::string_view piece) {
    if (piece.empty()) return;
    spans_.emplace_back(static_cast<uint32_t>(text_.size()), static_cast<uint32_t>(piece.size()));
    text_.append(piece);
  }
  // For pieces written in place: begin() returns the buffer to append to, end() closes the piece.
  std::string& begin_piece() { return text_; }
  void end_piece(size_t start) {
    if (text_.size() > start) {
      spans_.emplace_back(static_cast<uint32_t>(start), static_cast<uint32_t>(text_.size() - start));
    }
  }
  void swap(Pieces& other) noexcept {
    text_.swap(other.text_);
    spans_.swap(other.spans_);
  }

 private:
  std::string text_;
  std::vector<std::pair<uint32_t, uint32_t>> spans_;  // (offset, length)
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces, in order; empty pieces are dropped. `scratch` is
  // working memory.
  virtual void pre_tokenize(Pieces& pieces, Pieces& scratch) const = 0;
};

// Null gives nullptr; unknown types and malformed fields throw m3::Error naming `where`.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& where);

}  // namespace m3::text
