// Classes of text that many tokens of a byte-level vocabulary belong to and that many grammar
// states treat character by character alike: plain text (valid UTF-8 without control characters
// and without the two characters that end or escape a JSON string, " and \) in string bodies
// and free text, letters and digits in patterns and formats (counted ones: an email's parts),
// and digits in numbers. The masks of such states are computed for the class's
// tokens in bulk, by length (grammar/vocabulary.h, grammar/text_runs.h); only the other tokens
// are walked.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>

namespace m3::grammar {

enum class TextClass : uint8_t { kPlain, kAlnum, kDigits };
inline constexpr int32_t kNumTextClasses = 3;

// Tokens of a class longer than this (in characters) are treated as any other token.
inline constexpr int32_t kMaxClassChars = 32;

// One character's UTF-8 encodings: at each position, bytes lo..hi.
struct CharShape {
  int32_t length = 0;
  struct Range {
    uint8_t lo, hi;
  } bytes[4];
};
// Every character of the class has exactly one of these shapes.
std::span<const CharShape> char_shapes(TextClass cls);

// The number of characters of `bytes` when all of it is text of the class, else -1.
int32_t class_chars(TextClass cls, std::string_view bytes);

}  // namespace m3::grammar
