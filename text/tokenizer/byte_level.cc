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
    std::string utf8;
    unicode::append_utf8(utf8, code_point);
    utf8_[b][0] = utf8[0];
    utf8_[b][1] = utf8.size() > 1 ? utf8[1] : '\0';
    utf8_[b][2] = static_cast<char>(utf8.size());
    byte_of_code_point_[code_point] = static_cast<int16_t>(b);
  }
}


}  // namespace m3::text
