#include "grammar/text_class.h"

#include <array>

namespace m3::grammar {

std::span<const CharShape> char_shapes(TextClass cls) {
  // Plain: ASCII without the controls (0x00-0x1F, 0x7F), '"' and '\'; then the well-formed
  // UTF-8 sequences of U+0080-U+10FFFF without the surrogates (the table of RFC 3629).
  static constexpr std::array<CharShape, 11> kPlain = {{
      {1, {{0x20, 0x21}}},
      {1, {{0x23, 0x5B}}},
      {1, {{0x5D, 0x7E}}},
      {2, {{0xC2, 0xDF}, {0x80, 0xBF}}},
      {3, {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}}},
      {3, {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}}},
      {3, {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}}},
      {3, {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}}},
      {4, {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},
      {4, {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},
      {4, {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}},
  }};
  static constexpr std::array<CharShape, 1> kDigits = {{{1, {{'0', '9'}}}}};
  static constexpr std::array<CharShape, 3> kAlnum = {{{1, {{'0', '9'}}}, {1, {{'A', 'Z'}}}, {1, {{'a', 'z'}}}}};
  if (cls == TextClass::kDigits) return kDigits;
  if (cls == TextClass::kAlnum) return kAlnum;
  return kPlain;
}

int32_t class_chars(TextClass cls, std::string_view bytes) {
  int32_t chars = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    bool matched = false;
    for (const CharShape& shape : char_shapes(cls)) {
      if (i + static_cast<size_t>(shape.length) > bytes.size()) continue;
      bool fits = true;
      for (int32_t k = 0; k < shape.length && fits; ++k) {
        const auto b = static_cast<uint8_t>(bytes[i + static_cast<size_t>(k)]);
        fits = b >= shape.bytes[k].lo && b <= shape.bytes[k].hi;
      }
      if (fits) {
        i += static_cast<size_t>(shape.length);
        matched = true;
        break;
      }
    }
    if (!matched) return -1;
    ++chars;
  }
  return chars;
}

}  // namespace m3::grammar
