#include "text/tokenizer/byte_level.h"

#include "text/tokenizer/unicode.h"

namespace m3::text {

const ByteLevelTable& ByteLevelTable::get() {
  static const ByteLevelTable table;  // immutable after construction
  return table;
}

ByteLevelTable::ByteLevelTable() {
  byte_of_code_point_.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const char32_t code_point = printable(b) ? static_cast<char32_t>(b) : 256 + next_extra++;
    unicode::append_utf8(chars_[b], code_point);
    byte_of_code_point_[code_point] = static_cast<int16_t>(b);
  }
}

void ByteLevelTable::encode(std::string_view bytes, std::string& out) const {
  for (char ch : bytes) out.append(chars_[static_cast<uint8_t>(ch)]);
}

}  // namespace m3::text
