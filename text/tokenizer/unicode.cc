#include "text/tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace m3::text::unicode {

namespace {

// Byte length of the sequence a lead byte announces (1 for continuation and invalid bytes).
size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

// Valid range of the second byte of a sequence, which depends on the lead byte (Unicode table
// 3-7): it excludes overlong forms, surrogates and code points above U+10FFFF.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

bool is_continuation(unsigned char b) { return b >= 0x80 && b <= 0xBF; }

// Length of the maximal subpart of a sequence starting at pos: how many bytes form a valid prefix
// of some well-formed sequence (at least 1). Also reports whether the whole sequence is complete.
size_t valid_prefix_length(std::string_view s, size_t pos, bool* complete) {
  const auto lead = static_cast<unsigned char>(s[pos]);
  const size_t need = utf8_sequence_length(lead);
  *complete = false;
  if (lead < 0x80) {
    *complete = true;
    return 1;
  }
  if (need == 1) return 1;  // a stray continuation byte or an invalid lead byte
  size_t len = 1;
  while (len < need && pos + len < s.size()) {
    const auto b = static_cast<unsigned char>(s[pos + len]);
    const bool ok = len == 1 ? second_byte_ok(lead, b) : is_continuation(b);
    if (!ok) break;
    ++len;
  }
  *complete = len == need;
  return len;
}

}  // namespace

size_t decode_utf8(std::string_view text, size_t pos, char32_t* code_point) {
  bool complete = false;
  const size_t len = valid_prefix_length(text, pos, &complete);
  if (!complete) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data() + pos);
  switch (len) {
    case 1: *code_point = p[0]; break;
    case 2: *code_point = (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F); break;
    case 3:
      *code_point = (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
      break;
    default:
      *code_point = (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
                    (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
  return len;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<unsigned char>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete = false;
    const size_t len = valid_prefix_length(bytes, pos, &complete);
    if (!complete) return false;
    pos += len;
  }
  return true;
}

std::string to_valid_utf8(std::string_view bytes) {
  if (is_valid_utf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    const size_t len = valid_prefix_length(bytes, pos, &complete);
    if (complete) {
      out.append(bytes.substr(pos, len));
    } else {
      append_utf8(out, kReplacementChar);
    }
    pos += len;
  }
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      break;
  }
  // Join_Control and the symbols that are Other_Alphabetic (circled and squared letters).
  return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
         (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
         (c >= 0x1F170 && c <= 0x1F189);
}

namespace {

// Characters that every normal form leaves alone and that never combine with a neighbour:
// ASCII, CJK ideographs and the common emoji blocks. The composing forms also keep Latin-1 and
// Latin Extended (below U+0300: compatibility mappings there only matter to NFKC), precomposed
// Hangul syllables and kana. Anything else sends its line through utf8proc.
bool is_stable(char32_t c, NormalForm form) {
  if (c < 0x80) return true;
  if ((c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
      (c >= 0x1F300 && c <= 0x1F64F) || (c >= 0x1F680 && c <= 0x1F6FF) ||
      (c >= 0x1F900 && c <= 0x1F9FF)) {
    return true;
  }
  if (form == NormalForm::kNfc && c < 0x300) return true;
  if (form == NormalForm::kNfc || form == NormalForm::kNfkc) {
    return (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x3041 && c <= 0x3096) ||
           (c >= 0x30A1 && c <= 0x30FA);
  }
  return false;
}

std::string utf8proc_normalize(std::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  M3_CHECK(n >= 0, "unicode normalization failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace

std::string normalize(std::string_view text, NormalForm form) {
  // A line feed is a starter that never composes, so lines normalize independently; lines made
  // of stable characters only are copied as they are.
  std::string out;
  out.reserve(text.size());
  size_t line_begin = 0;
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    line_end = line_end == std::string_view::npos ? text.size() : line_end + 1;
    const std::string_view line = text.substr(line_begin, line_end - line_begin);
    bool stable = true;
    for (size_t pos = 0; pos < line.size() && stable;) {
      if (static_cast<unsigned char>(line[pos]) < 0x80) {
        ++pos;
        continue;
      }
      char32_t c = 0;
      const size_t len = decode_utf8(line, pos, &c);
      stable = len != 0 && is_stable(c, form);
      pos += len;
    }
    if (stable) {
      out.append(line);
    } else {
      out.append(utf8proc_normalize(line, form));
    }
    line_begin = line_end;
  }
  return out;
}

std::string to_lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const auto b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++pos;
      continue;
    }
    char32_t c = 0;
    const size_t len = decode_utf8(text, pos, &c);
    if (len == 0) {  // callers pass valid UTF-8; keep stray bytes unchanged
      out.push_back(text[pos++]);
      continue;
    }
    pos += len;
    if (c == 0x130) {  // the only unconditional multi-character lowercase mapping
      out.append("i\xCC\x87");
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

}  // namespace m3::text::unicode
