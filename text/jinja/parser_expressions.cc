#include <fmt/format.h>

#include "text/jinja/builtins.h"
#include "text/jinja/parser_expressions.h"

namespace m3::jinja {

bool ExpressionParser::is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
  TokenType type = current().type;
  if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || at_op(")")) return true;
  for (std::string_view name : extra_end) {
    if (at_name(name)) return true;
  }
  return false;
}

ExprPtr ExpressionParser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr ExpressionParser::parse_condexpr() {
  int line = current().line;
  ExprPtr expr = parse_or();
  while (skip_name("if")) {
    auto cond = std::make_unique<CondExpr>(line);
    cond->then_expr = std::move(expr);
    cond->test = parse_or();
    if (skip_name("else")) cond->else_expr = parse_condexpr();
    expr = std::move(cond);
    line = current().line;
  }
  return expr;
}

ExprPtr ExpressionParser::parse_or() {
  int line = current().line;
  ExprPtr left = parse_and();
  while (skip_name("or")) {
    left = std::make_unique<BinaryExpr>(ExprKind::kOr, BinaryOp::kAdd, std::move(left), parse_and(), line);
    line = current().line;
  }
  return left;
}

ExprPtr ExpressionParser::parse_and() {
  int line = current().line;
  ExprPtr left = parse_not();
  while (skip_name("and")) {
    left = std::make_unique<BinaryExpr>(ExprKind::kAnd, BinaryOp::kAdd, std::move(left), parse_not(), line);
    line = current().line;
  }
  return left;
}

ExprPtr ExpressionParser::parse_not() {
  if (at_name("not")) {
    int line = advance().line;
    return std::make_unique<UnaryExpr>(ExprKind::kNot, parse_not(), line);
  }
  return parse_compare();
}

ExprPtr ExpressionParser::parse_compare() {
  int line = current().line;
  ExprPtr expr = parse_math1();
  std::vector<std::pair<CompareOp, ExprPtr>> ops;
  while (true) {
    static const std::pair<std::string_view, CompareOp> kOps[] = {
        {"==", CompareOp::kEq}, {"!=", CompareOp::kNe}, {"<", CompareOp::kLt},
        {"<=", CompareOp::kLe}, {">", CompareOp::kGt},  {">=", CompareOp::kGe}};
    bool matched = false;
    for (const auto& [text, op] : kOps) {
      if (at_op(text)) {
        advance();
        ops.emplace_back(op, parse_math1());
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (skip_name("in")) {
      ops.emplace_back(CompareOp::kIn, parse_math1());
    } else if (at_name("not") && is_name(look(), "in")) {
      advance();
      advance();
      ops.emplace_back(CompareOp::kNotIn, parse_math1());
    } else {
      break;
    }
  }
  if (ops.empty()) return expr;
  auto compare = std::make_unique<CompareExpr>(line);
  compare->first = std::move(expr);
  compare->rest = std::move(ops);
  return compare;
}

ExprPtr ExpressionParser::parse_binary_level(ExprPtr (ExpressionParser::*next)(),
                                             std::initializer_list<std::pair<std::string_view, BinaryOp>> ops) {
  int line = current().line;
  ExprPtr left = (this->*next)();
  while (true) {
    bool matched = false;
    for (const auto& [text, op] : ops) {
      if (at_op(text)) {
        advance();
        left = std::make_unique<BinaryExpr>(ExprKind::kBinary, op, std::move(left), (this->*next)(), line);
        matched = true;
        break;
      }
    }
    if (!matched) return left;
    line = current().line;
  }
}

ExprPtr ExpressionParser::parse_math1() {
  return parse_binary_level(&ExpressionParser::parse_concat, {{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}});
}

ExprPtr ExpressionParser::parse_concat() {
  int line = current().line;
  ExprPtr first = parse_math2();
  if (!at_op("~")) return first;
  auto concat = std::make_unique<ConcatExpr>(line);
  concat->parts.push_back(std::move(first));
  while (skip_op("~")) concat->parts.push_back(parse_math2());
  return concat;
}

ExprPtr ExpressionParser::parse_math2() {
  return parse_binary_level(&ExpressionParser::parse_pow, {{"*", BinaryOp::kMul},
                                                 {"/", BinaryOp::kDiv},
                                                 {"//", BinaryOp::kFloorDiv},
                                                 {"%", BinaryOp::kMod}});
}

ExprPtr ExpressionParser::parse_pow() {
  return parse_binary_level(&ExpressionParser::parse_unary_with_filter, {{"**", BinaryOp::kPow}});
}

ExprPtr ExpressionParser::parse_unary_with_filter() { return parse_unary(true); }

ExprPtr ExpressionParser::parse_unary(bool with_filter) {
  int line = current().line;
  ExprPtr node;
  if (skip_op("-")) {
    node = std::make_unique<UnaryExpr>(ExprKind::kNeg, parse_unary(false), line);
  } else if (skip_op("+")) {
    node = std::make_unique<UnaryExpr>(ExprKind::kPos, parse_unary(false), line);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr ExpressionParser::parse_primary() {
  const Token& token = current();
  int line = token.line;
  switch (token.type) {
    case TokenType::kName: {
      const std::string& name = token.text;
      ExprPtr node;
      if (name == "true" || name == "True") {
        node = std::make_unique<ConstExpr>(Value::boolean(true), line);
      } else if (name == "false" || name == "False") {
        node = std::make_unique<ConstExpr>(Value::boolean(false), line);
      } else if (name == "none" || name == "None") {
        node = std::make_unique<ConstExpr>(Value::none(), line);
      } else {
        for (SpecialNames& used : special_names_) {
          used.caller = used.caller || name == "caller";
          used.varargs = used.varargs || name == "varargs";
          used.kwargs = used.kwargs || name == "kwargs";
        }
        node = std::make_unique<NameExpr>(name, line);
      }
      advance();
      return node;
    }
    case TokenType::kString: {
      std::string text = advance().text;
      while (current().type == TokenType::kString) text += advance().text;  // "a" "b"
      return std::make_unique<ConstExpr>(std::move(text), line);
    }
    case TokenType::kInteger: return std::make_unique<ConstExpr>(Value::integer(advance().int_value), line);
    case TokenType::kFloat: return std::make_unique<ConstExpr>(Value::number(advance().float_value), line);
    case TokenType::kOperator:
      if (token.text == "(") {
        advance();
        ExprPtr node = parse_tuple(false, true, {}, true);
        expect_op(")");
        return node;
      }
      if (token.text == "[") return parse_list();
      if (token.text == "{") return parse_dict();
      break;
    default: break;
  }
  if (token.type == TokenType::kEof) fail_eof({});
  fail(fmt::format("unexpected '{}'", describe_token(token)));
}

ExprPtr ExpressionParser::parse_tuple(bool simplified, bool with_condexpr,
                                      std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
  int line = current().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (at_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
    line = current().line;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) fail(fmt::format("Expected an expression, got '{}'", describe_token(current())));
  }
  auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
  tuple->items = std::move(items);
  return tuple;
}

ExprPtr ExpressionParser::parse_list() {
  auto list = std::make_unique<SequenceExpr>(ExprKind::kList, advance().line);
  while (!at_op("]")) {
    if (!list->items.empty()) expect_op(",");
    if (at_op("]")) break;
    list->items.push_back(parse_expression(true));
  }
  expect_op("]");
  return list;
}

ExprPtr ExpressionParser::parse_dict() {
  auto dict = std::make_unique<DictExpr>(advance().line);
  while (!at_op("}")) {
    if (!dict->items.empty()) expect_op(",");
    if (at_op("}")) break;
    ExprPtr key = parse_expression(true);
    expect_op(":");
    dict->items.emplace_back(std::move(key), parse_expression(true));
  }
  expect_op("}");
  return dict;
}

ExprPtr ExpressionParser::parse_postfix(ExprPtr node) {
  while (true) {
    if (at_op(".") || at_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (at_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExpressionParser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (at_op("|")) {
      node = parse_filter(std::move(node), false);
    } else if (at_name("is")) {
      node = parse_test(std::move(node));
    } else if (at_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr ExpressionParser::parse_subscript(ExprPtr node) {
  const Token& token = advance();
  int line = token.line;
  if (token.text == ".") {
    const Token& attr = advance();
    if (attr.type == TokenType::kName) return std::make_unique<GetattrExpr>(std::move(node), attr.text, line);
    if (attr.type != TokenType::kInteger) fail("expected name or number", attr.line);
    return std::make_unique<GetitemExpr>(
        std::move(node), std::make_unique<ConstExpr>(Value::integer(attr.int_value), attr.line), line);
  }
  std::vector<ExprPtr> args;
  while (!at_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  if (args.size() == 1) return std::make_unique<GetitemExpr>(std::move(node), std::move(args[0]), line);
  auto tuple = std::make_unique<SequenceExpr>(ExprKind::kTuple, line);
  tuple->items = std::move(args);
  return std::make_unique<GetitemExpr>(std::move(node), std::move(tuple), line);
}

ExprPtr ExpressionParser::parse_subscribed() {
  int line = current().line;
  ExprPtr start;
  if (!at_op(":")) {
    start = parse_expression(true);
    if (!at_op(":")) return start;
  }
  advance();  // ':'
  auto slice = std::make_unique<SliceExpr>(line);
  slice->start = std::move(start);
  if (!at_op("]") && !at_op(",") && !at_op(":")) slice->stop = parse_expression(true);
  if (skip_op(":")) {
    if (!at_op("]") && !at_op(",")) slice->step = parse_expression(true);
  }
  return slice;
}

CallArgsExpr ExpressionParser::parse_call_args() {
  int line = current().line;
  expect_op("(");
  CallArgsExpr args;
  auto ensure = [&](bool ok) {
    if (!ok) fail("invalid syntax for function call expression", line);
  };
  bool require_comma = false;
  while (!at_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (at_op(")")) break;
    }
    if (skip_op("*")) {
      ensure(!args.star_args && !args.star_kwargs);
      args.star_args = parse_expression(true);
    } else if (skip_op("**")) {
      ensure(!args.star_kwargs);
      args.star_kwargs = parse_expression(true);
    } else if (current().type == TokenType::kName && is_op(look(), "=")) {
      ensure(!args.star_kwargs);
      std::string key = advance().text;
      advance();
      args.keyword.emplace_back(std::move(key), parse_expression(true));
    } else {
      ensure(!args.star_args && !args.star_kwargs && args.keyword.empty());
      args.positional.push_back(parse_expression(true));
    }
    require_comma = true;
  }
  expect_op(")");
  return args;
}

ExprPtr ExpressionParser::parse_call(ExprPtr node) {
  auto call = std::make_unique<CallExpr>(current().line);
  call->callee = std::move(node);
  call->args = parse_call_args();
  return call;
}

std::string ExpressionParser::parse_dotted_name() {
  std::string name = expect_name().text;
  while (skip_op(".")) name += "." + expect_name().text;
  return name;
}

ExprPtr ExpressionParser::parse_filter(ExprPtr node, bool start_inline) {
  while (at_op("|") || start_inline) {
    if (!start_inline) advance();
    start_inline = false;
    int line = current().line;
    auto filter = std::make_unique<FilterExpr>(line);
    filter->name = parse_dotted_name();
    filter->fn = find_filter(filter->name);
    filter->unknown = !filter->fn && !is_jinja2_filter(filter->name);
    if (at_op("(")) filter->args = parse_call_args();
    filter->input = std::move(node);
    node = std::move(filter);
  }
  return node;
}

ExprPtr ExpressionParser::parse_test(ExprPtr node) {
  int line = advance().line;  // 'is'
  bool negated = skip_name("not");
  auto test = std::make_unique<TestExpr>(line);
  test->name = parse_dotted_name();
  test->fn = find_test(test->name);
  test->unknown = !test->fn && !is_jinja2_test(test->name);
  const Token& next = current();
  if (at_op("(")) {
    test->args = parse_call_args();
  } else if ((next.type == TokenType::kName || next.type == TokenType::kString ||
              next.type == TokenType::kInteger || next.type == TokenType::kFloat || at_op("[") ||
              at_op("{")) &&
             !at_name("else") && !at_name("or") && !at_name("and")) {
    if (at_name("is")) fail("You cannot chain multiple tests with is");
    test->args.positional.push_back(parse_postfix(parse_primary()));
  }
  test->input = std::move(node);
  if (negated) return std::make_unique<UnaryExpr>(ExprKind::kNot, std::move(test), line);
  return test;
}

}  // namespace m3::jinja
