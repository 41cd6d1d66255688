#include "text/jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>

#include "text/jinja/pystr.h"
#include "text/jinja/value.h"

namespace m3::jinja {
namespace {

// Operators, longest first so that "//" wins over "/".
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*",
                                           "%",  "~",  "[",  "]",  "(",  ")",  "{", "}", ">", "<",
                                           "=",  ".",  ":",  "|",  ",",  ";"};

bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
bool is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
bool is_name_char(char ch) { return is_name_start(ch) || is_digit(ch); }

int hex_value(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = find_tag_start(pos);
      if (start == std::string::npos) {
        emit_data(pos, src_.substr(pos));
        break;
      }
      char opener = src_[start + 1];
      size_t raw_end = opener == '%' ? match_raw_begin(start) : std::string::npos;
      char sign = start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')
                      ? src_[start + 2]
                      : 0;
      emit_data(pos, strip_before_tag(src_.substr(pos, start - pos), sign, opener != '{',
                                      line_starting));
      if (raw_end != std::string::npos) {
        pos = lex_raw(start, raw_end, line_starting);
      } else if (opener == '#') {
        pos = skip_comment(start, start + 2 + (sign ? 1 : 0));
        line_starting = src_[pos - 1] == '\n';
      } else {
        pos = lex_tag(start, start + 2 + (sign ? 1 : 0), opener == '%');
        line_starting = src_[pos - 1] == '\n';
      }
    }
    Token eof{TokenType::kEof, ""};
    locate(eof, src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t pos, std::string message) {
    RenderError error("TemplateSyntaxError", message);
    error.line = line_of(pos);
    throw error;
  }

  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) -
                            line_starts_.begin());
  }

  void locate(Token& token, size_t pos) const {
    token.line = line_of(pos);
    token.column = static_cast<int>(pos - line_starts_[token.line - 1]) + 1;
  }

  size_t find_tag_start(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  bool starts_with(size_t pos, std::string_view text) const {
    return src_.compare(pos, text.size(), text) == 0;
  }

  // Python's \s at pos (one character); returns its byte length or 0.
  size_t space_at(size_t pos) const {
    if (pos >= src_.size()) return 0;
    auto lead = static_cast<unsigned char>(src_[pos]);
    size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    std::u32string c = pystr::decode(std::string_view(src_).substr(pos, n));
    return !c.empty() && pystr::is_space(c[0]) ? n : 0;
  }

  size_t skip_spaces(size_t pos) const {
    while (size_t n = space_at(pos)) pos += n;
    return pos;
  }

  // `{%[-+]? \s* raw \s* (-%}\s* | %})`: returns the end of the match or npos.
  size_t match_raw_begin(size_t start) const {
    size_t p = start + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (!starts_with(p, "raw")) return std::string::npos;
    p = skip_spaces(p + 3);
    if (starts_with(p, "-%}")) return skip_spaces(p + 3);
    if (starts_with(p, "%}")) return p + 2;
    return std::string::npos;
  }

  // Whitespace control of the text before a tag: `-` strips all whitespace, lstrip_blocks strips
  // the indentation of a block or comment tag that is alone at the start of its line.
  std::string strip_before_tag(std::string text, char sign, bool is_block_or_comment,
                               bool line_starting) const {
    if (sign == '-') return pystr::strip(text, std::nullopt, pystr::StripSide::kRight);
    if (sign == '+' || !is_block_or_comment) return text;
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if (l_pos == 0 && !line_starting) return text;
    std::u32string tail = pystr::decode(std::string_view(text).substr(l_pos));
    if (tail.empty() || !std::all_of(tail.begin(), tail.end(), pystr::is_space)) return text;
    text.resize(l_pos);
    return text;
  }

  void emit_data(size_t pos, std::string text) {
    if (text.empty()) return;
    Token token{TokenType::kData, std::move(text)};
    locate(token, pos);
    tokens_.push_back(std::move(token));
  }

  size_t lex_raw(size_t start, size_t body, bool& line_starting) {
    line_starting = src_[body - 1] == '\n';
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_spaces(q);
      if (!starts_with(q, "endraw")) continue;
      q = skip_spaces(q + 6);
      size_t end;
      if (starts_with(q, "+%}")) {
        end = q + 3;
      } else if (starts_with(q, "-%}")) {
        end = skip_spaces(q + 3);
      } else if (starts_with(q, "%}")) {
        end = q + 2 + (q + 2 < src_.size() && src_[q + 2] == '\n');
      } else {
        continue;
      }
      emit_data(body, strip_before_tag(src_.substr(body, p - body), sign, true, line_starting));
      line_starting = src_[end - 1] == '\n';
      return end;
    }
    fail(start, "Missing end of raw directive");
  }

  size_t skip_comment(size_t start, size_t body) {
    for (size_t p = src_.find("#}", body); p != std::string::npos; p = src_.find("#}", p + 1)) {
      if (p > body && src_[p - 1] == '-') return skip_spaces(p + 2);
      if (p > body && src_[p - 1] == '+') return p + 2;
      return p + 2 + (p + 2 < src_.size() && src_[p + 2] == '\n');
    }
    fail(start, "Missing end of comment tag");
  }

  size_t lex_tag(size_t start, size_t pos, bool is_block) {
    Token begin{is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, ""};
    locate(begin, start);
    tokens_.push_back(begin);
    std::vector<char> balance;
    while (true) {
      if (pos >= src_.size()) {
        fail(start, fmt::format("unexpected end of template, expected '{}'", is_block ? "%}" : "}}"));
      }
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (is_block) {
          if (starts_with(pos, "-%}")) {
            end = skip_spaces(pos + 3);
          } else if (starts_with(pos, "+%}")) {
            end = pos + 3;
          } else if (starts_with(pos, "%}")) {
            end = pos + 2 + (pos + 2 < src_.size() && src_[pos + 2] == '\n');
          }
        } else if (starts_with(pos, "-}}")) {
          end = skip_spaces(pos + 3);
        } else if (starts_with(pos, "}}")) {
          end = pos + 2;
        }
        if (end != std::string::npos) {
          Token close{is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, ""};
          locate(close, pos);
          tokens_.push_back(close);
          return end;
        }
      }
      if (size_t n = space_at(pos)) {
        pos += n;
        continue;
      }
      Token token{TokenType::kOperator, ""};
      locate(token, pos);
      size_t next = lex_number(pos, token);
      if (next == std::string::npos && is_name_start(src_[pos])) {
        next = pos;
        while (next < src_.size() && is_name_char(src_[next])) ++next;
        token.type = TokenType::kName;
        token.text = src_.substr(pos, next - pos);
      }
      if (next == std::string::npos && (src_[pos] == '\'' || src_[pos] == '"')) {
        next = lex_string(pos, token);
      }
      if (next == std::string::npos) {
        for (std::string_view op : kOperators) {
          if (starts_with(pos, op)) {
            next = pos + op.size();
            token.text = std::string(op);
            break;
          }
        }
        if (next == std::string::npos) {
          fail(pos, fmt::format("unexpected char {} at {}", repr(Value::string(std::string(
                                                                 1, src_[pos]))),
                                pos));
        }
        char op = token.text[0];
        if (op == '(' || op == '[' || op == '{') {
          balance.push_back(op == '(' ? ')' : op == '[' ? ']' : '}');
        } else if (token.text.size() == 1 && (op == ')' || op == ']' || op == '}')) {
          if (balance.empty()) fail(pos, fmt::format("unexpected '{}'", op));
          if (balance.back() != op) {
            fail(pos, fmt::format("unexpected '{}', expected '{}'", op, balance.back()));
          }
          balance.pop_back();
        }
      }
      tokens_.push_back(std::move(token));
      pos = next;
    }
  }

  // Digits with optional single underscores between them; returns the end or npos.
  size_t digits(size_t pos, int (*digit)(char)) const {
    if (pos >= src_.size() || digit(src_[pos]) < 0) return std::string::npos;
    size_t p = pos + 1;
    while (p < src_.size()) {
      if (digit(src_[p]) >= 0) {
        ++p;
      } else if (src_[p] == '_' && p + 1 < src_.size() && digit(src_[p + 1]) >= 0) {
        p += 2;
      } else {
        break;
      }
    }
    return p;
  }

  size_t lex_number(size_t pos, Token& token) {
    auto decimal = [](char ch) { return is_digit(ch) ? ch - '0' : -1; };
    if (!is_digit(src_[pos])) return std::string::npos;
    auto strip_underscores = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    // Floats first (never right after a '.', so `a.0.1` stays attribute access).
    if (pos == 0 || src_[pos - 1] != '.') {
      size_t int_end = digits(pos, decimal);
      size_t p = int_end;
      bool has_fraction = false;
      if (p < src_.size() && src_[p] == '.') {
        size_t frac_end = digits(p + 1, decimal);
        if (frac_end != std::string::npos) p = frac_end, has_fraction = true;
      }
      size_t end = has_fraction ? p : std::string::npos;
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        size_t exp_end = digits(q, decimal);
        if (exp_end != std::string::npos) end = exp_end;
      }
      if (end != std::string::npos) {
        token.type = TokenType::kFloat;
        token.text = src_.substr(pos, end - pos);
        token.float_value = std::strtod(strip_underscores(token.text).c_str(), nullptr);
        return end;
      }
    }
    token.type = TokenType::kInteger;
    char prefix = pos + 1 < src_.size() ? static_cast<char>(src_[pos + 1] | 0x20) : 0;
    int base = 10;
    size_t end = std::string::npos;
    std::string digits_text;
    if (src_[pos] == '0' && (prefix == 'x' || prefix == 'o' || prefix == 'b')) {
      // 0x1F, 0o17, 0b101, with an optional underscore after the prefix; a bare "0x" is the
      // integer 0 followed by the name x.
      int prefixed_base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : 2;
      size_t p = pos + 2;
      if (p < src_.size() && src_[p] == '_') ++p;
      auto digit = prefixed_base == 16 ? +[](char ch) { return hex_value(ch); }
                   : prefixed_base == 8 ? +[](char ch) { return ch >= '0' && ch <= '7' ? ch - '0' : -1; }
                                        : +[](char ch) { return ch == '0' || ch == '1' ? ch - '0' : -1; };
      end = digits(p, digit);
      if (end != std::string::npos) {
        base = prefixed_base;
        digits_text = strip_underscores(src_.substr(p, end - p));
      }
    }
    if (end == std::string::npos && src_[pos] == '0') {
      end = pos + 1;  // "0", "00", "0_0": all zero
      while (end < src_.size() &&
             (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0'))) {
        end += src_[end] == '_' ? 2 : 1;
      }
      digits_text.assign(1, '0');
    } else if (end == std::string::npos) {
      end = digits(pos, decimal);
      digits_text = strip_underscores(src_.substr(pos, end - pos));
    }
    errno = 0;
    unsigned long long value = std::strtoull(digits_text.c_str(), nullptr, base);
    if (errno == ERANGE || value > static_cast<unsigned long long>(INT64_MAX)) {
      fail(pos, "integer literal too large");
    }
    token.int_value = static_cast<int64_t>(value);
    token.text = src_.substr(pos, end - pos);
    return end;
  }

  size_t lex_string(size_t pos, Token& token) {
    char quote = src_[pos];
    size_t p = pos + 1;
    while (p < src_.size() && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) return std::string::npos;
    token.type = TokenType::kString;
    token.text = unescape(pos, src_.substr(pos + 1, p - pos - 1));
    return p + 1;
  }

  // Python's "unicode-escape" decoding, which jinja2 applies to string literals.
  std::string unescape(size_t pos, const std::string& body) {
    std::string out;
    out.reserve(body.size());
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\') {
        out.push_back(body[i]);
        continue;
      }
      if (++i >= body.size()) fail(pos, "\\ at end of string");
      char ch = body[i];
      auto read_hex = [&](int count) {
        char32_t c = 0;
        for (int k = 0; k < count; ++k) {
          int h = i + 1 < body.size() ? hex_value(body[i + 1]) : -1;
          if (h < 0) {
            fail(pos, fmt::format("truncated \\{}{} escape", ch,
                                  std::string(count, ch == 'x' ? 'X' : 'X')));
          }
          c = c * 16 + h;
          ++i;
        }
        return c;
      };
      switch (ch) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': pystr::append_utf8(out, read_hex(2)); break;
        case 'u': pystr::append_utf8(out, read_hex(4)); break;
        case 'U': {
          char32_t c = read_hex(8);
          if (c > 0x10FFFF) fail(pos, "illegal Unicode character");
          pystr::append_utf8(out, c);
          break;
        }
        case 'N': fail(pos, "\\N{...} escapes are not supported");
        default:
          if (ch >= '0' && ch <= '7') {
            char32_t c = ch - '0';
            for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
                 ++k) {
              c = c * 8 + (body[++i] - '0');
            }
            pystr::append_utf8(out, c);
          } else if (static_cast<unsigned char>(ch) >= 0x80) {
            // jinja2 first turns non-ASCII characters into Python escapes, so a backslash
            // before one leaves that escape's text.
            auto lead = static_cast<unsigned char>(ch);
            size_t n = lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
            char32_t c = pystr::decode(std::string_view(body).substr(i, n))[0];
            i += n - 1;
            out += c <= 0xFF ? fmt::format("\\x{:02x}", static_cast<unsigned>(c))
                   : c <= 0xFFFF ? fmt::format("\\u{:04x}", static_cast<unsigned>(c))
                                 : fmt::format("\\U{:08x}", static_cast<unsigned>(c));
          } else {
            out.push_back('\\');
            out.push_back(ch);
          }
      }
    }
    return out;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// Newlines become "\n" and one trailing newline goes, as jinja2 does before lexing.
std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  if (!pystr::is_valid_utf8(source)) throw_error("TemplateSyntaxError", "template is not valid UTF-8");
  return Lexer(normalize_source(source)).run();
}

const char* describe(TokenType type) {
  switch (type) {
    case TokenType::kData: return "template data";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName: return "name";
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return "operator";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

}  // namespace m3::jinja
