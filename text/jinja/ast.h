// The parsed template: expression and statement nodes as jinja2's parser builds them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace m3::jinja {

class Interpreter;
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// A filter or test implementation: the input value and the call's arguments.
using FilterFn = Value (*)(Interpreter& interp, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter& interp, const Value& input, CallArgs& args);

enum class ExprKind : uint8_t {
  kConst,
  kName,
  kList,
  kTuple,
  kDict,
  kGetattr,
  kGetitem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBinary,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCondExpr,
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr {
  Expr(ExprKind kind, int line) : kind(kind), line(line) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};

struct ConstExpr : Expr {
  ConstExpr(Value value, int line) : Expr(ExprKind::kConst, line), value(std::move(value)) {}
  // A string literal: the value borrows `text`, so using it costs no reference counting.
  ConstExpr(std::string literal, int line)
      : Expr(ExprKind::kConst, line), text(std::move(literal)), value(Value::borrowed_string(text)) {}
  ConstExpr(const ConstExpr&) = delete;
  ConstExpr& operator=(const ConstExpr&) = delete;
  std::string text;
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string name, int line) : Expr(ExprKind::kName, line), name(std::move(name)) {}
  std::string name;
};

// List and tuple literals (kind tells which).
struct SequenceExpr : Expr {
  using Expr::Expr;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int line) : Expr(ExprKind::kDict, line) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetattrExpr : Expr {
  GetattrExpr(ExprPtr object, std::string attr, int line)
      : Expr(ExprKind::kGetattr, line), object(std::move(object)), attr(std::move(attr)) {}
  ExprPtr object;
  std::string attr;
};

struct GetitemExpr : Expr {
  GetitemExpr(ExprPtr object, ExprPtr index, int line)
      : Expr(ExprKind::kGetitem, line), object(std::move(object)), index(std::move(index)) {}
  ExprPtr object;
  ExprPtr index;  // a SliceExpr for obj[a:b:c]
};

struct SliceExpr : Expr {
  explicit SliceExpr(int line) : Expr(ExprKind::kSlice, line) {}
  ExprPtr start, stop, step;  // null when omitted
};

struct CallArgsExpr {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star_args, star_kwargs;  // *args, **kwargs
};

struct CallExpr : Expr {
  explicit CallExpr(int line) : Expr(ExprKind::kCall, line) {}
  ExprPtr callee;
  CallArgsExpr args;
};

// `input | name(args)`; input is null inside {% filter %} and {% set x | f %} blocks.
struct FilterExpr : Expr {
  explicit FilterExpr(int line) : Expr(ExprKind::kFilter, line) {}
  ExprPtr input;
  std::string name;
  FilterFn fn = nullptr;  // null: m3serve lacks it (fails when used)
  bool unknown = false;   // jinja2 lacks it too (a syntax error outside if/else: checks.cc)
  CallArgsExpr args;
};

struct TestExpr : Expr {
  explicit TestExpr(int line) : Expr(ExprKind::kTest, line) {}
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;
  bool unknown = false;
  CallArgsExpr args;
};

struct UnaryExpr : Expr {
  UnaryExpr(ExprKind kind, ExprPtr operand, int line) : Expr(kind, line), operand(std::move(operand)) {}
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  BinaryExpr(ExprKind kind, BinaryOp op, ExprPtr left, ExprPtr right, int line)
      : Expr(kind, line), op(op), left(std::move(left)), right(std::move(right)) {}
  BinaryOp op;  // for kBinary
  ExprPtr left, right;
};

struct ConcatExpr : Expr {
  explicit ConcatExpr(int line) : Expr(ExprKind::kConcat, line) {}
  std::vector<ExprPtr> parts;
};

struct CompareExpr : Expr {
  explicit CompareExpr(int line) : Expr(ExprKind::kCompare, line) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

struct CondExpr : Expr {
  explicit CondExpr(int line) : Expr(ExprKind::kCondExpr, line) {}
  ExprPtr test, then_expr, else_expr;  // else_expr may be null
};

// ---- statements ----------------------------------------------------------------------------

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind : uint8_t {
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kScope,
  kBreak,
  kContinue,
};

struct Stmt {
  Stmt(StmtKind kind, int line) : kind(kind), line(line) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};

// Text and {{ expressions }} in order; a null expr means `text` is literal template data.
struct OutputStmt : Stmt {
  explicit OutputStmt(int line) : Stmt(StmtKind::kOutput, line) {}
  struct Part {
    std::string text;
    ExprPtr expr;
  };
  std::vector<Part> parts;
};

// Assignment targets: a name, a (nested) tuple of names, or namespace.attribute.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNamespaceAttr } kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
  int line = 0;
};

struct IfStmt : Stmt {
  explicit IfStmt(int line) : Stmt(StmtKind::kIf, line) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif ...
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int line) : Stmt(StmtKind::kFor, line) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // `for x in y if cond`
  bool recursive = false;
  Body body, else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int line) : Stmt(StmtKind::kSet, line) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int line) : Stmt(StmtKind::kSetBlock, line) {}
  Target target;
  ExprPtr filter;  // chain of FilterExpr with a null innermost input, or null
  Body body;
};

// A macro signature and body; also the anonymous `caller` of a {% call %} block.
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int line) : Stmt(StmtKind::kMacro, line) {}
  MacroDef def;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int line) : Stmt(StmtKind::kCallBlock, line) {}
  MacroDef caller;
  std::unique_ptr<CallExpr> call;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int line) : Stmt(StmtKind::kFilterBlock, line) {}
  ExprPtr filter;  // FilterExpr chain with a null innermost input
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int line) : Stmt(StmtKind::kWith, line) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

// A body rendered in place: {% generation %} (transformers' assistant-mask extension).
struct ScopeStmt : Stmt {
  explicit ScopeStmt(int line) : Stmt(StmtKind::kScope, line) {}
  Body body;
};

struct TemplateAst {
  Body body;
};

}  // namespace m3::jinja
