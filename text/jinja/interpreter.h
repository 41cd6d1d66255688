// Renders a parsed template. Scoping follows jinja2: {% if %} shares its scope, each loop
// iteration, macro call, {% with %} and captured block gets a child scope, and macros see the
// scope they were defined in (looked up when called, like Python closures).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace m3::jinja {

// Names are views: they point into the template's AST, the caller's JSON keys or literals, all
// of which outlive a render.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent_(std::move(parent)) {}
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
  void clear();

 private:
  // Most scopes (a loop iteration, a macro call) hold a few names: those live inline.
  static constexpr size_t kInline = 4;
  std::shared_ptr<Scope> parent_;
  std::pair<std::string_view, Value> inline_[kInline];
  size_t inline_count_ = 0;
  std::vector<std::pair<std::string_view, Value>> more_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Namespace;

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}
  ~Interpreter();  // breaks the reference cycles macros and namespaces can form
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string render(const TemplateAst& ast, const ScopePtr& root);

  Value eval(const Expr& expr, const ScopePtr& scope);
  // eval without copying names and constants: the result is either in the scope, in the AST
  // or in `storage`, and stays valid while the scope is not assigned to.
  const Value& eval_ref(const Expr& expr, const ScopePtr& scope, Value& storage);
  // Calls any callable value (macro, function, method, loop).
  Value call(const Value& callee, CallArgs& args);
  const RenderOptions& options() const { return options_; }
  std::shared_ptr<Namespace> new_namespace();

  // Used by the Macro and LoopContext objects.
  Value call_macro(const MacroDef& def, const ScopePtr& closure, CallArgs& args);
  Value run_loop(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable, int depth0);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_for(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable, int depth0,
                std::string& out);
  std::string capture(const Body& body, const ScopePtr& parent);
  void assign(const Target& target, Value value, const ScopePtr& scope);
  Value eval_uncaught(const Expr& expr, const ScopePtr& scope);
  CallArgs eval_args(const CallArgsExpr& args, const ScopePtr& scope);
  Value apply_filter(const FilterExpr& filter, const ScopePtr& scope, const Value* block_input);
  Value make_macro(const MacroDef& def, const ScopePtr& scope);

  const RenderOptions& options_;
  int call_depth_ = 0;
  std::vector<ScopePtr> captured_scopes_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
};

}  // namespace m3::jinja
