#include "text/jinja/parser.h"

#include <fmt/format.h>

#include <initializer_list>

#include "text/jinja/builtins.h"
#include "text/jinja/parser_expressions.h"

namespace m3::jinja {
namespace {

constexpr std::string_view kUnsupportedTags[] = {"block", "extends", "include", "import", "from",
                                                 "autoescape", "do"};

class Parser : public ExpressionParser {
 public:
  using ExpressionParser::ExpressionParser;

  std::unique_ptr<TemplateAst> parse() {
    auto ast = std::make_unique<TemplateAst>();
    ast->body = subparse({});
    return ast;
  }

 private:
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
      // Its body is a caller macro in jinja2: loop controls inside do not reach an outer loop.
      auto scope = std::make_unique<ScopeStmt>(advance().line);
      int saved_depth = loop_depth_;
      loop_depth_ = 0;
      scope->body = parse_statements({"endgeneration"}, true);
      loop_depth_ = saved_depth;
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

  int loop_depth_ = 0;  // for {% break %} / {% continue %} outside a loop
};

}  // namespace

std::unique_ptr<TemplateAst> parse_template(std::string_view source) {
  std::unique_ptr<TemplateAst> ast = Parser(tokenize(source)).parse();
  check_filter_and_test_names(*ast);
  return ast;
}

}  // namespace m3::jinja
