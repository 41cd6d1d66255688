// The compile-time name check of jinja2's code generator: filters and tests must exist, except
// in "soft" frames (the test and branches of {% if %}, inline if-expressions), where jinja2
// defers the error to the moment the filter is called. Loops, macros, blocks and {% with %}
// open new frames that are not soft.
#include <fmt/format.h>

#include "text/jinja/parser.h"

namespace m3::jinja {
namespace {

class NameChecker {
 public:
  void body(const Body& statements, bool soft) {
    for (const StmtPtr& stmt : statements) statement(*stmt, soft);
  }

 private:
  [[noreturn]] static void fail(const std::string& message, int line) {
    RenderError error("TemplateSyntaxError", message);
    error.line = line;
    throw error;
  }

  void statement(const Stmt& stmt, bool soft) {
    switch (stmt.kind) {
      case StmtKind::kOutput:
        for (const auto& part : static_cast<const OutputStmt&>(stmt).parts) {
          if (part.expr) expr(*part.expr, soft);
        }
        return;
      case StmtKind::kIf: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [test, branch] : s.branches) {
          expr(*test, true);
          body(branch, true);
        }
        body(s.else_body, true);
        return;
      }
      case StmtKind::kFor: {
        const auto& s = static_cast<const ForStmt&>(stmt);
        expr(*s.iter, soft);
        if (s.filter) expr(*s.filter, false);
        body(s.body, false);
        body(s.else_body, false);
        return;
      }
      case StmtKind::kSet: expr(*static_cast<const SetStmt&>(stmt).value, soft); return;
      case StmtKind::kSetBlock: {
        const auto& s = static_cast<const SetBlockStmt&>(stmt);
        body(s.body, false);
        if (s.filter) expr(*s.filter, false);
        return;
      }
      case StmtKind::kMacro: macro(static_cast<const MacroStmt&>(stmt).def); return;
      case StmtKind::kCallBlock: {
        const auto& s = static_cast<const CallBlockStmt&>(stmt);
        expr(*s.call, soft);
        macro(s.caller);
        return;
      }
      case StmtKind::kFilterBlock: {
        const auto& s = static_cast<const FilterBlockStmt&>(stmt);
        body(s.body, false);
        expr(*s.filter, false);
        return;
      }
      case StmtKind::kWith: {
        const auto& s = static_cast<const WithStmt&>(stmt);
        for (const auto& [target, value] : s.assignments) expr(*value, soft);
        body(s.body, false);
        return;
      }
      case StmtKind::kScope: body(static_cast<const ScopeStmt&>(stmt).body, false); return;
      case StmtKind::kBreak:
      case StmtKind::kContinue: return;
    }
  }

  void macro(const MacroDef& def) {
    for (const ExprPtr& d : def.defaults) expr(*d, false);
    body(def.body, false);
  }

  void args(const CallArgsExpr& a, bool soft) {
    for (const ExprPtr& e : a.positional) expr(*e, soft);
    for (const auto& [name, e] : a.keyword) expr(*e, soft);
    if (a.star_args) expr(*a.star_args, soft);
    if (a.star_kwargs) expr(*a.star_kwargs, soft);
  }

  void expr(const Expr& e, bool soft) {
    switch (e.kind) {
      case ExprKind::kConst:
      case ExprKind::kName: return;
      case ExprKind::kList:
      case ExprKind::kTuple:
        for (const ExprPtr& item : static_cast<const SequenceExpr&>(e).items) expr(*item, soft);
        return;
      case ExprKind::kDict:
        for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
          expr(*k, soft);
          expr(*v, soft);
        }
        return;
      case ExprKind::kGetattr: expr(*static_cast<const GetattrExpr&>(e).object, soft); return;
      case ExprKind::kGetitem: {
        const auto& g = static_cast<const GetitemExpr&>(e);
        expr(*g.object, soft);
        expr(*g.index, soft);
        return;
      }
      case ExprKind::kSlice: {
        const auto& s = static_cast<const SliceExpr&>(e);
        for (const ExprPtr* part : {&s.start, &s.stop, &s.step}) {
          if (*part) expr(**part, soft);
        }
        return;
      }
      case ExprKind::kCall: {
        const auto& c = static_cast<const CallExpr&>(e);
        expr(*c.callee, soft);
        args(c.args, soft);
        return;
      }
      case ExprKind::kFilter: {
        const auto& f = static_cast<const FilterExpr&>(e);
        if (f.unknown && !soft) fail(fmt::format("No filter named '{}'.", f.name), e.line);
        if (f.input) expr(*f.input, soft);
        args(f.args, soft);
        return;
      }
      case ExprKind::kTest: {
        const auto& t = static_cast<const TestExpr&>(e);
        if (t.unknown && !soft) fail(fmt::format("No test named '{}'.", t.name), e.line);
        expr(*t.input, soft);
        args(t.args, soft);
        return;
      }
      case ExprKind::kNeg:
      case ExprKind::kPos:
      case ExprKind::kNot: expr(*static_cast<const UnaryExpr&>(e).operand, soft); return;
      case ExprKind::kBinary:
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        const auto& b = static_cast<const BinaryExpr&>(e);
        expr(*b.left, soft);
        expr(*b.right, soft);
        return;
      }
      case ExprKind::kConcat:
        for (const ExprPtr& part : static_cast<const ConcatExpr&>(e).parts) expr(*part, soft);
        return;
      case ExprKind::kCompare: {
        const auto& c = static_cast<const CompareExpr&>(e);
        expr(*c.first, soft);
        for (const auto& [op, operand] : c.rest) expr(*operand, soft);
        return;
      }
      case ExprKind::kCondExpr: {
        const auto& c = static_cast<const CondExpr&>(e);
        expr(*c.test, true);
        expr(*c.then_expr, true);
        if (c.else_expr) expr(*c.else_expr, true);
        return;
      }
    }
  }
};

}  // namespace

void check_filter_and_test_names(const TemplateAst& ast) { NameChecker().body(ast.body, false); }

}  // namespace m3::jinja
