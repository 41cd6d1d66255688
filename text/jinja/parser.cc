#include "text/jinja/parser.h"

#include <fmt/format.h>

#include <initializer_list>

#include "text/jinja/builtins.h"
#include "text/jinja/lexer.h"

namespace m3::jinja {
namespace {

constexpr std::string_view kUnsupportedTags[] = {"block", "extends", "include", "import", "from",
                                                 "autoescape", "do"};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::unique_ptr<TemplateAst> parse() {
    auto ast = std::make_unique<TemplateAst>();
    ast->body = subparse({});
    return ast;
  }

 private:
  // ---- token stream ----

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

  // ---- statements ----

  Body subparse(std::vector<std::string_view> end_names) {
    Body body;
    std::unique_ptr<OutputStmt> output;
    auto flush = [&] {
      if (output) body.push_back(std::move(output));
    };
    while (current().type != TokenType::kEof) {
      const Token& token = current();
      if (token.type == TokenType::kData) {
        if (!output) output = std::make_unique<OutputStmt>(token.line);
        output->parts.push_back({token.text, nullptr});
        advance();
      } else if (token.type == TokenType::kVariableBegin) {
        if (!output) output = std::make_unique<OutputStmt>(token.line);
        advance();
        output->parts.push_back({"", parse_tuple(false, true, {}, false)});
        expect(TokenType::kVariableEnd);
      } else if (token.type == TokenType::kBlockBegin) {
        flush();
        advance();
        for (std::string_view end : end_names) {
          if (at_name(end)) return body;
        }
        if (StmtPtr stmt = parse_statement()) body.push_back(std::move(stmt));
        expect(TokenType::kBlockEnd);
      } else {
        fail(fmt::format("unexpected '{}'", describe_token(token)));
      }
    }
    flush();
    if (!end_names.empty()) fail_eof(end_names);
    return body;
  }

  // The body of a block statement, up to one of `end_names` (left as the current token unless
  // drop_needle).
  Body parse_statements(std::vector<std::string_view> end_names, bool drop_needle) {
    skip_op(":");
    expect(TokenType::kBlockEnd);
    Body body = subparse(end_names);
    if (drop_needle) advance();
    return body;
  }

  StmtPtr parse_statement() {
    const Token& token = current();
    if (token.type != TokenType::kName) fail("tag name expected");
    std::string tag = token.text;
    for (std::string_view unsupported : kUnsupportedTags) {
      if (tag == unsupported) {
        fail(fmt::format("the '{}' tag is not supported by m3serve's chat template interpreter", tag));
      }
    }
    tag_stack_.push_back(tag);
    StmtPtr stmt;
    if (tag == "if") {
      stmt = parse_if();
    } else if (tag == "for") {
      stmt = parse_for();
    } else if (tag == "set") {
      stmt = parse_set();
    } else if (tag == "macro") {
      stmt = parse_macro();
    } else if (tag == "call") {
      stmt = parse_call_block();
    } else if (tag == "filter") {
      stmt = parse_filter_block();
    } else if (tag == "with") {
      stmt = parse_with();
    } else if (tag == "print") {
      stmt = parse_print();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside loop", tag));
      advance();
      stmt = std::make_unique<Stmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, token.line);
    } else if (tag == "generation") {
      auto scope = std::make_unique<ScopeStmt>(advance().line);
      scope->body = parse_statements({"endgeneration"}, true);
      stmt = std::move(scope);
    } else {
      tag_stack_.pop_back();
      std::string message = fmt::format("Encountered unknown tag '{}'.", tag);
      if (!tag_stack_.empty()) {
        message += fmt::format(" The innermost block that needs to be closed is '{}'.", tag_stack_.back());
      }
      fail(message, token.line);
    }
    tag_stack_.pop_back();
    return stmt;
  }

  StmtPtr parse_if() {
    auto stmt = std::make_unique<IfStmt>(advance().line);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      stmt->branches.emplace_back(std::move(test), std::move(body));
      const Token& token = advance();
      if (token.text == "elif") continue;
      if (token.text == "else") stmt->else_body = parse_statements({"endif"}, true);
      break;
    }
    return stmt;
  }

  StmtPtr parse_for() {
    auto stmt = std::make_unique<ForStmt>(advance().line);
    stmt->target = parse_assign_target(true, false, {"in"});
    expect_keyword("in");
    stmt->iter = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) stmt->filter = parse_expression(true);
    stmt->recursive = skip_name("recursive");
    ++loop_depth_;
    stmt->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (advance().text == "else") stmt->else_body = parse_statements({"endfor"}, true);
    return stmt;
  }

  StmtPtr parse_set() {
    int line = advance().line;
    Target target = parse_assign_target(true, true, {});
    if (skip_op("=")) {
      auto stmt = std::make_unique<SetStmt>(line);
      stmt->target = std::move(target);
      stmt->value = parse_tuple(false, true, {}, false);
      return stmt;
    }
    auto stmt = std::make_unique<SetBlockStmt>(line);
    stmt->target = std::move(target);
    stmt->filter = parse_filter(nullptr, false);
    stmt->body = parse_statements({"endset"}, true);
    return stmt;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!at_op(")")) {
      if (!def.params.empty()) expect_op(",");
      def.params.push_back(expect_name().text);
      if (skip_op("=")) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  // Parses a macro-like body, recording whether it uses caller/varargs/kwargs (jinja2 only
  // accepts extra arguments when the body refers to them).
  void parse_macro_body(MacroDef& def, std::string_view end_name) {
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    special_names_.emplace_back();
    def.body = parse_statements({end_name}, true);
    SpecialNames used = special_names_.back();
    special_names_.pop_back();
    loop_depth_ = saved_depth;
    def.uses_caller = used.caller;
    def.uses_varargs = used.varargs;
    def.uses_kwargs = used.kwargs;
  }

  StmtPtr parse_macro() {
    auto stmt = std::make_unique<MacroStmt>(advance().line);
    stmt->def.name = expect_name().text;
    parse_signature(stmt->def);
    parse_macro_body(stmt->def, "endmacro");
    return stmt;
  }

  StmtPtr parse_call_block() {
    auto stmt = std::make_unique<CallBlockStmt>(advance().line);
    stmt->caller.name = "caller";
    if (at_op("(")) parse_signature(stmt->caller);
    int line = current().line;
    ExprPtr call = parse_expression(true);
    if (call->kind != ExprKind::kCall) fail("expected call", line);
    stmt->call.reset(static_cast<CallExpr*>(call.release()));
    parse_macro_body(stmt->caller, "endcall");
    return stmt;
  }

  StmtPtr parse_filter_block() {
    auto stmt = std::make_unique<FilterBlockStmt>(advance().line);
    stmt->filter = parse_filter(nullptr, true);
    stmt->body = parse_statements({"endfilter"}, true);
    return stmt;
  }

  StmtPtr parse_with() {
    auto stmt = std::make_unique<WithStmt>(advance().line);
    while (current().type != TokenType::kBlockEnd) {
      if (!stmt->assignments.empty()) expect_op(",");
      Target target = parse_assign_target(true, false, {});
      expect_op("=");
      stmt->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    stmt->body = parse_statements({"endwith"}, true);
    return stmt;
  }

  StmtPtr parse_print() {
    auto stmt = std::make_unique<OutputStmt>(advance().line);
    while (current().type != TokenType::kBlockEnd) {
      if (!stmt->parts.empty()) expect_op(",");
      stmt->parts.push_back({"", parse_expression(true)});
    }
    return stmt;
  }

  Target parse_assign_target(bool with_tuple, bool with_namespace,
                             std::initializer_list<std::string_view> extra_end) {
    Target target;
    target.line = current().line;
    if (with_namespace && current().type == TokenType::kName && is_op(look(), ".")) {
      target.kind = Target::Kind::kNamespaceAttr;
      target.name = advance().text;
      advance();
      target.attr = expect_name().text;
      return target;
    }
    // jinja2 parses a "simplified" tuple of primaries and then requires names.
    std::vector<Target> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_target_primary());
      if (with_tuple && at_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (items.empty()) fail(fmt::format("Expected an expression, got '{}'", describe_token(current())));
      return std::move(items[0]);
    }
    target.kind = Target::Kind::kTuple;
    target.items = std::move(items);
    return target;
  }

  Target parse_target_primary() {
    Target target;
    target.line = current().line;
    if (current().type == TokenType::kName) {
      const std::string& name = current().text;
      if (name == "true" || name == "false" || name == "True" || name == "False" || name == "none" ||
          name == "None") {
        fail("can't assign to 'const'");
      }
      target.name = advance().text;
      return target;
    }
    if (skip_op("(")) {
      Target inner = parse_assign_target(true, false, {});
      expect_op(")");
      return inner;
    }
    fail(fmt::format("can't assign to '{}'", describe_token(current())));
  }

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    TokenType type = current().type;
    if (type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || at_op(")")) return true;
    for (std::string_view name : extra_end) {
      if (at_name(name)) return true;
    }
    return false;
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
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

  ExprPtr parse_or() {
    int line = current().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      left = std::make_unique<BinaryExpr>(ExprKind::kOr, BinaryOp::kAdd, std::move(left), parse_and(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = current().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      left = std::make_unique<BinaryExpr>(ExprKind::kAnd, BinaryOp::kAdd, std::move(left), parse_not(), line);
      line = current().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      int line = advance().line;
      return std::make_unique<UnaryExpr>(ExprKind::kNot, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
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

  ExprPtr parse_binary_level(ExprPtr (Parser::*next)(),
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

  ExprPtr parse_math1() {
    return parse_binary_level(&Parser::parse_concat, {{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}});
  }

  ExprPtr parse_concat() {
    int line = current().line;
    ExprPtr first = parse_math2();
    if (!at_op("~")) return first;
    auto concat = std::make_unique<ConcatExpr>(line);
    concat->parts.push_back(std::move(first));
    while (skip_op("~")) concat->parts.push_back(parse_math2());
    return concat;
  }

  ExprPtr parse_math2() {
    return parse_binary_level(&Parser::parse_pow, {{"*", BinaryOp::kMul},
                                                   {"/", BinaryOp::kDiv},
                                                   {"//", BinaryOp::kFloorDiv},
                                                   {"%", BinaryOp::kMod}});
  }

  ExprPtr parse_pow() {
    return parse_binary_level(&Parser::parse_unary_with_filter, {{"**", BinaryOp::kPow}});
  }

  ExprPtr parse_unary_with_filter() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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
        return std::make_unique<ConstExpr>(Value::string(std::move(text)), line);
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

  ExprPtr parse_tuple(bool simplified, bool with_condexpr,
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

  ExprPtr parse_list() {
    auto list = std::make_unique<SequenceExpr>(ExprKind::kList, advance().line);
    while (!at_op("]")) {
      if (!list->items.empty()) expect_op(",");
      if (at_op("]")) break;
      list->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return list;
  }

  ExprPtr parse_dict() {
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr node) {
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

  ExprPtr parse_subscribed() {
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

  CallArgsExpr parse_call_args() {
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

  ExprPtr parse_call(ExprPtr node) {
    auto call = std::make_unique<CallExpr>(current().line);
    call->callee = std::move(node);
    call->args = parse_call_args();
    return call;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name().text;
    while (skip_op(".")) name += "." + expect_name().text;
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
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

  ExprPtr parse_test(ExprPtr node) {
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

  struct SpecialNames {
    bool caller = false, varargs = false, kwargs = false;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<SpecialNames> special_names_;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<TemplateAst> parse_template(std::string_view source) {
  std::unique_ptr<TemplateAst> ast = Parser(tokenize(source)).parse();
  check_filter_and_test_names(*ast);
  return ast;
}

}  // namespace m3::jinja
