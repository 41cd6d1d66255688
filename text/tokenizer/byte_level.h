// GPT-2's byte-to-character table: every byte gets a printable code point (the printable Latin-1
// bytes map to themselves, the others to U+0100 onwards), so byte-level BPE vocabularies are text.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::text {

class ByteLevelTable {
 public:
  static const ByteLevelTable& get();

  // The UTF-8 encoding of the character standing for `byte`.
  const std::string& char_of(uint8_t byte) const { return chars_[byte]; }
  // Appends the byte-level characters of `bytes` to `out`.
  void encode(std::string_view bytes, std::string& out) const;
  // The byte a code point stands for, or -1 when it is not one of the 256 characters.
  int byte_of(char32_t code_point) const {
    return code_point < byte_of_code_point_.size() ? byte_of_code_point_[code_point] : -1;
  }

 private:
  ByteLevelTable();
  std::array<std::string, 256> chars_;
  std::array<int16_t, 324> byte_of_code_point_{};  // the characters are all below U+0144
};

}  // namespace m3::text
