// The expression half of the parser and its token stream (the statement half is parser.cc):
// jinja2's operator precedence, tuples without parentheses, postfix subscripts and calls,
// filters and tests with their arguments.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace m3::jinja {

class ExpressionParser {
 public:
  explicit ExpressionParser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

 protected:
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& advance() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  bool at_op(std::string_view op) const { return is_op(current(), op); }
  static bool is_op(const Token& t, std::string_view op) {
    return t.type == TokenType::kOperator && t.text == op;
  }
  static bool is_name(const Token& t, std::string_view name) {
    return t.type == TokenType::kName && t.text == name;
  }
  bool at_name(std::string_view name) const { return is_name(current(), name); }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe_token(const Token& t) {
    if (t.type == TokenType::kName || t.type == TokenType::kOperator) return t.text;
    return describe(t.type);
  }

  [[noreturn]] void fail(const std::string& message, int line = 0) const {
    RenderError error("TemplateSyntaxError", message);
    error.line = line ? line : current().line;
    throw error;
  }

  void expect_op(std::string_view op) {
    if (!at_op(op)) fail(fmt::format("expected token '{}', got '{}'", op, describe_token(current())));
    advance();
  }
  void expect(TokenType type) {
    if (current().type != type) {
      if (current().type == TokenType::kEof) fail_eof({});
      fail(fmt::format("expected token '{}', got '{}'", describe(type), describe_token(current())));
    }
    advance();
  }
  const Token& expect_name() {
    if (current().type != TokenType::kName) {
      fail(fmt::format("expected token 'name', got '{}'", describe_token(current())));
    }
    return advance();
  }
  void expect_keyword(std::string_view name) {
    if (!at_name(name)) fail(fmt::format("expected token '{}', got '{}'", name, describe_token(current())));
    advance();
  }

  [[noreturn]] void fail_eof(std::vector<std::string_view> end_names) const {
    std::string message = "Unexpected end of template.";
    if (!end_names.empty()) {
      message += " Jinja was looking for the following tags: ";
      for (size_t k = 0; k < end_names.size(); ++k) {
        message += fmt::format("{}'{}'", k ? " or " : "", end_names[k]);
      }
      message += ".";
    }
    if (!tag_stack_.empty()) {
      message += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
    }
    fail(message);
  }


  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const;
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_binary_level(ExprPtr (ExpressionParser::*next)(),
                             std::initializer_list<std::pair<std::string_view, BinaryOp>> ops);
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary_with_filter();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                      std::initializer_list<std::string_view> extra_end, bool explicit_parens);
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  CallArgsExpr parse_call_args();
  ExprPtr parse_call(ExprPtr node);
  std::string parse_dotted_name();
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);

  // Whether a macro body refers to caller, varargs or kwargs (jinja2 only passes them then);
  // one entry per macro being parsed.
  struct SpecialNames {
    bool caller = false, varargs = false, kwargs = false;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::vector<std::string> tag_stack_;  // open block tags, for error messages
  std::vector<SpecialNames> special_names_;
};

}  // namespace m3::jinja
