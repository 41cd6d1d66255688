// Python `str` semantics over UTF-8 std::string: templates index, slice, strip, split and
// case-map strings by code point, and must print them as Python's repr() does.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/unicode.h"

namespace m3::jinja::pystr {

// One UTF-8 encoder and validator for the whole text layer (text/tokenizer/unicode.h: strict,
// no overlong forms, surrogates or code points above U+10FFFF).
using text::unicode::append_utf8;
using text::unicode::is_valid_utf8;

// The template source and JSON inputs are valid UTF-8 (checked where they enter).
std::u32string decode(std::string_view text);
std::string encode(std::u32string_view text);
bool is_ascii(std::string_view text);
size_t length(std::string_view text);  // in code points

// Character classes as Python's str methods define them (Unicode data from utf8proc).
bool is_space(char32_t c);      // str.isspace, and re's \s
bool is_printable(char32_t c);  // str.isprintable
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_numeric(char32_t c);
bool is_alnum(char32_t c);
bool is_word(char32_t c);  // re's \w: alnum or '_'
bool is_cased(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_line_break(char32_t c);  // str.splitlines boundaries

std::string upper(std::string_view text);
std::string lower(std::string_view text);
std::string title(std::string_view text);       // str.title
std::string capitalize(std::string_view text);  // str.capitalize
std::string swapcase(std::string_view text);
bool all_match(std::string_view text, bool (*predicate)(char32_t));  // str.isdigit etc.
bool is_upper_str(std::string_view text);  // str.isupper
bool is_lower_str(std::string_view text);  // str.islower

enum class StripSide { kBoth, kLeft, kRight };
// `chars` absent: whitespace, as str.strip().
std::string strip(std::string_view text, const std::optional<std::string>& chars, StripSide side);
// sep absent: runs of whitespace, as str.split(); maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view text, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view text, bool keep_ends);
// count < 0: all occurrences (an empty `old` inserts between code points, as Python does).
std::string replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                    int64_t count);
// Code point index of the first (last) occurrence within [start, end), or -1.
int64_t find(std::string_view text, std::string_view sub, int64_t start, int64_t end, bool reverse);
int64_t count(std::string_view text, std::string_view sub, int64_t start, int64_t end);

// Python's repr() of a str: quotes, escapes of non-printable characters.
void append_repr(std::string& out, std::string_view text);

// Padding to a width in code points, as str.center/ljust/rjust.
std::string pad(std::string_view text, int64_t width, char32_t fill, char align);

}  // namespace m3::jinja::pystr
