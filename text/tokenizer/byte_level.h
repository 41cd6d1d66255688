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

  // Appends the byte-level characters of `bytes` to `out`.
  void encode(std::string_view bytes, std::string& out) const {
    const size_t start = out.size();
    out.resize(start + 2 * bytes.size());  // every character takes one or two bytes
    char* dst = out.data() + start;
    for (char ch : bytes) {
      const auto& utf8 = utf8_[static_cast<uint8_t>(ch)];
      dst[0] = utf8[0];
      dst[1] = utf8[1];
      dst += utf8[2];
    }
    out.resize(static_cast<size_t>(dst - out.data()));
  }
  // The byte a code point stands for, or -1 when it is not one of the 256 characters.
  int byte_of(char32_t code_point) const {
    return code_point < byte_of_code_point_.size() ? byte_of_code_point_[code_point] : -1;
  }

 private:
  ByteLevelTable();
  std::array<std::array<char, 3>, 256> utf8_{};  // the 1 or 2 bytes, then the length
  std::array<int16_t, 324> byte_of_code_point_{};  // the characters are all below U+0144
};

}  // namespace m3::text
