// Splits a template into data and tag tokens the way jinja2's lexer does with transformers'
// settings: trim_blocks (drop the newline after a block or comment tag), lstrip_blocks (drop
// the indentation before a block or comment tag that starts a line), `-`/`+` whitespace
// control, {% raw %}, and no trailing newline (keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace m3::jinja {

enum class TokenType : uint8_t {
  kData,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Throws RenderError("TemplateSyntaxError") with the line of the problem.
std::vector<Token> tokenize(std::string_view source);

const char* describe(TokenType type);

}  // namespace m3::jinja
