#include "text/jinja/pystr.h"

#include "text/jinja/special_casing.h"

#include <utf8proc.h>

#include <algorithm>

namespace m3::jinja::pystr {
namespace {

utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

template <class Map>
std::string map_chars(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decode(text)) append_utf8(out, map(c));
  return out;
}

// A full case mapping: the one-to-many special cases, else utf8proc's simple mapping.
void append_mapped(std::string& out, char32_t c, const char* (*special)(char32_t),
                   char32_t (*simple)(char32_t)) {
  if (c >= 0x80) {
    if (const char* mapped = special(c)) {
      out += mapped;
      return;
    }
  }
  append_utf8(out, simple(c));
}

// Python's slice-index adjustment for str.find/count (negative indices count from the end).
void adjust_range(int64_t size, int64_t& start, int64_t& end) {
  if (end > size) end = size;
  if (end < 0) end = std::max<int64_t>(end + size, 0);
  if (start < 0) start = std::max<int64_t>(start + size, 0);
}

}  // namespace

std::u32string decode(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    char32_t c;
    size_t n;
    if (lead < 0x80) {
      c = lead, n = 1;
    } else if (lead < 0xE0) {
      c = lead & 0x1F, n = 2;
    } else if (lead < 0xF0) {
      c = lead & 0x0F, n = 3;
    } else {
      c = lead & 0x07, n = 4;
    }
    for (size_t k = 1; k < n && i + k < text.size(); ++k) {
      c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    }
    out.push_back(c);
    i += n;
  }
  return out;
}

std::string encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char ch) { return static_cast<unsigned char>(ch) < 0x80; });
}

size_t length(std::string_view text) {
  size_t n = 0;
  for (char ch : text) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  switch (category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_alnum(char32_t c) { return is_alpha(c) || is_numeric(c); }
bool is_word(char32_t c) { return c == '_' || is_alnum(c); }

bool is_cased(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT || utf8proc_isupper(static_cast<utf8proc_int32_t>(c)) ||
         utf8proc_islower(static_cast<utf8proc_int32_t>(c));
}
bool is_upper(char32_t c) { return utf8proc_isupper(static_cast<utf8proc_int32_t>(c)); }
bool is_lower(char32_t c) { return utf8proc_islower(static_cast<utf8proc_int32_t>(c)); }

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::string upper(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decode(text)) append_mapped(out, c, special_upper, to_upper);
  return out;
}

std::string lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : decode(text)) append_mapped(out, c, special_lower, to_lower);
  return out;
}
std::string swapcase(std::string_view text) {
  return map_chars(text, [](char32_t c) {
    if (is_upper(c)) return to_lower(c);
    if (is_lower(c)) return to_upper(c);
    return c;
  });
}

std::string title(std::string_view text) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : decode(text)) {
    if (previous_cased) {
      append_mapped(out, c, special_lower, to_lower);
    } else {
      append_mapped(out, c, special_title, to_title);
    }
    previous_cased = is_cased(c);
  }
  return out;
}

std::string capitalize(std::string_view text) {
  std::string out;
  bool first = true;
  for (char32_t c : decode(text)) {
    if (first) {
      append_mapped(out, c, special_title, to_title);
    } else {
      append_mapped(out, c, special_lower, to_lower);
    }
    first = false;
  }
  return out;
}

bool all_match(std::string_view text, bool (*predicate)(char32_t)) {
  if (text.empty()) return false;
  for (char32_t c : decode(text)) {
    if (!predicate(c)) return false;
  }
  return true;
}

bool is_upper_str(std::string_view text) {
  bool cased = false;
  for (char32_t c : decode(text)) {
    if (is_lower(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    cased = cased || is_upper(c);
  }
  return cased;
}

bool is_lower_str(std::string_view text) {
  bool cased = false;
  for (char32_t c : decode(text)) {
    if (is_upper(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    cased = cased || is_lower(c);
  }
  return cased;
}

std::string strip(std::string_view text, const std::optional<std::string>& chars, StripSide side) {
  std::u32string s = decode(text);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_space(c);
  };
  size_t begin = 0, end = s.size();
  if (side != StripSide::kRight) {
    while (begin < end && strippable(s[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(s[end - 1])) --end;
  }
  return encode(std::u32string_view(s).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> parts;
  int64_t remaining = maxsplit < 0 ? INT64_MAX : maxsplit;
  if (sep) {
    size_t i = 0;
    while (remaining-- > 0) {
      size_t pos = text.find(*sep, i);
      if (pos == std::string_view::npos) break;
      parts.emplace_back(text.substr(i, pos - i));
      i = pos + sep->size();
    }
    parts.emplace_back(text.substr(i));
    return parts;
  }
  std::u32string s = decode(text);
  size_t i = 0, n = s.size();
  while (remaining-- > 0) {
    while (i < n && is_space(s[i])) ++i;
    if (i == n) break;
    size_t j = i++;
    while (i < n && !is_space(s[i])) ++i;
    parts.push_back(encode(std::u32string_view(s).substr(j, i - j)));
  }
  if (i < n) {
    while (i < n && is_space(s[i])) ++i;
    if (i != n) parts.push_back(encode(std::u32string_view(s).substr(i)));
  }
  return parts;
}

std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> parts;
  int64_t remaining = maxsplit < 0 ? INT64_MAX : maxsplit;
  if (sep) {
    size_t end = text.size();
    while (remaining-- > 0 && end >= sep->size()) {
      size_t pos = text.rfind(*sep, end - sep->size());
      if (pos == std::string_view::npos) break;
      parts.emplace_back(text.substr(pos + sep->size(), end - pos - sep->size()));
      end = pos;
    }
    parts.emplace_back(text.substr(0, end));
  } else {
    std::u32string s = decode(text);
    int64_t i = static_cast<int64_t>(s.size()) - 1;
    while (remaining-- > 0) {
      while (i >= 0 && is_space(s[i])) --i;
      if (i < 0) break;
      int64_t j = i--;
      while (i >= 0 && !is_space(s[i])) --i;
      parts.push_back(encode(std::u32string_view(s).substr(i + 1, j - i)));
    }
    if (i >= 0) {
      while (i >= 0 && is_space(s[i])) --i;
      if (i >= 0) parts.push_back(encode(std::u32string_view(s).substr(0, i + 1)));
    }
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view text, bool keep_ends) {
  std::u32string s = decode(text);
  std::vector<std::string> lines;
  size_t i = 0, n = s.size();
  while (i < n) {
    size_t j = i;
    while (i < n && !is_line_break(s[i])) ++i;
    size_t eol = i;
    if (i < n) {
      i += (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
      if (keep_ends) eol = i;
    }
    lines.push_back(encode(std::u32string_view(s).substr(j, eol - j)));
  }
  return lines;
}

std::string replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                    int64_t count) {
  std::string out;
  int64_t remaining = count < 0 ? INT64_MAX : count;
  if (old_text.empty()) {
    std::u32string s = decode(text);
    for (char32_t c : s) {
      if (remaining > 0) out += new_text, --remaining;
      append_utf8(out, c);
    }
    if (remaining > 0) out += new_text;
    return out;
  }
  size_t i = 0;
  while (remaining > 0) {
    size_t pos = text.find(old_text, i);
    if (pos == std::string_view::npos) break;
    out.append(text.substr(i, pos - i));
    out.append(new_text);
    i = pos + old_text.size();
    --remaining;
  }
  out.append(text.substr(i));
  return out;
}

int64_t find(std::string_view text, std::string_view sub, int64_t start, int64_t end,
             bool reverse) {
  std::u32string s = decode(text), needle = decode(sub);
  int64_t size = static_cast<int64_t>(s.size());
  adjust_range(size, start, end);
  int64_t width = static_cast<int64_t>(needle.size());
  if (end - start < width) return -1;
  std::u32string_view window = std::u32string_view(s).substr(start, end - start);
  size_t pos = reverse ? window.rfind(needle) : window.find(needle);
  return pos == std::u32string_view::npos ? -1 : start + static_cast<int64_t>(pos);
}

int64_t count(std::string_view text, std::string_view sub, int64_t start, int64_t end) {
  std::u32string s = decode(text), needle = decode(sub);
  int64_t size = static_cast<int64_t>(s.size());
  adjust_range(size, start, end);
  if (end - start < static_cast<int64_t>(needle.size())) return 0;
  if (needle.empty()) return end - start + 1;
  std::u32string_view window = std::u32string_view(s).substr(start, end - start);
  int64_t n = 0;
  for (size_t pos = window.find(needle); pos != std::u32string_view::npos;
       pos = window.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

void append_repr(std::string& out, std::string_view text) {
  bool has_single = text.find('\'') != std::string_view::npos;
  bool has_double = text.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  out.push_back(quote);
  static const char* hex = "0123456789abcdef";
  for (char32_t c : decode(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xF]);
    } else if (c < 0x7F || is_printable(c)) {
      append_utf8(out, c);
    } else {
      int digits = c <= 0xFF ? 2 : c <= 0xFFFF ? 4 : 8;
      out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
      for (int k = digits - 1; k >= 0; --k) out.push_back(hex[(c >> (4 * k)) & 0xF]);
    }
  }
  out.push_back(quote);
}

std::string pad(std::string_view text, int64_t width, char32_t fill, char align) {
  int64_t n = static_cast<int64_t>(length(text));
  if (width <= n) return std::string(text);
  int64_t margin = width - n, left = 0;
  if (align == '^') {
    left = margin / 2 + (margin & width & 1);
  } else if (align == '>') {
    left = margin;
  }
  std::string out, fill_utf8;
  append_utf8(fill_utf8, fill);
  for (int64_t k = 0; k < left; ++k) out += fill_utf8;
  out += text;
  for (int64_t k = left; k < margin; ++k) out += fill_utf8;
  return out;
}

}  // namespace m3::jinja::pystr
