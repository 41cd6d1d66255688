// One-to-many case mappings (ß -> SS, ŉ -> ʼN, İ -> i̇, ...) that Python's str case methods apply.
#pragma once

namespace m3::jinja::pystr {

// The UTF-8 mapping of c when it is not a single character, else nullptr.
const char* special_upper(char32_t c);
const char* special_lower(char32_t c);
const char* special_title(char32_t c);

}  // namespace m3::jinja::pystr
