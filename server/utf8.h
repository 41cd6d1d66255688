// Strict UTF-8 validation of client input (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), so a bad byte is reported with its offset instead of surfacing later as a
// tokenizer or JSON failure.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace m3::server {

// Byte offset of the first byte that does not start a valid UTF-8 sequence; nullopt when valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

}  // namespace m3::server
