// A small byte-level vocabulary for grammar tests: every single byte, then multi-byte pieces that
// straddle JSON and markup boundaries ("\":", "},{", "]<]", ...), words, and a few eos ids.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/vocabulary.h"

namespace m3::grammar::testing {

inline std::vector<std::optional<std::string>> test_token_bytes() {
  std::vector<std::optional<std::string>> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"\":", "\": ", "\",\"", "},{", "{\"", "\"}", "[{", "}]", "true", "false", "null", "12", "0.",
                        ".5", "e+", "ab", "name", "\"name\"", " the", "]<]", "]<]minimax[>[", "<invoke", "name=\"",
                        "\">", "</", ">\n", "tool_call", "invoke", "é", "日本", "\\n", "\\\"", "\\u00", "a\"", "1,", ", "})
    t.push_back(std::string(s));
  t.push_back(std::nullopt);  // a special token the client would not see
  t.push_back(std::string());  // an empty token
  t.push_back(std::nullopt);   // eos
  return t;
}

inline std::shared_ptr<const Vocabulary> test_vocabulary() {
  auto t = test_token_bytes();
  const int32_t eos = static_cast<int32_t>(t.size()) - 1;
  return std::make_shared<const Vocabulary>(t, std::vector<int32_t>{eos});
}

}  // namespace m3::grammar::testing
