// UTF-8 and Unicode helpers with the semantics of Rust's `str`/`char`, which the Hugging Face
// `tokenizers` library (the reference for every tokenizer.json) is written against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::text::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at text[pos]. Returns its byte length, or 0 when the bytes at
// pos do not start a valid sequence (Rust strings never hold those; see to_valid_utf8).
size_t decode_utf8(std::string_view text, size_t pos, char32_t* code_point);
void append_utf8(std::string& out, char32_t code_point);

// Replaces every invalid sequence by U+FFFD, one per maximal subpart, exactly like Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace").
std::string to_valid_utf8(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

// Rust char::is_whitespace (the Unicode White_Space property).
bool is_white_space(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// The Unicode `\w` of Rust's regex crate: Alphabetic, marks, Nd, Pc, Join_Control.
bool is_word_char(char32_t c);

// Unicode normalization forms on valid UTF-8.
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view text, NormalForm form);
// Rust char::to_lowercase applied per character (full mappings, no context-sensitive rules).
std::string to_lowercase(std::string_view text);

}  // namespace m3::text::unicode
