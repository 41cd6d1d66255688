#include "text/jinja/interpreter.h"

#include <fmt/format.h>

#include "text/jinja/builtins.h"
#include "text/jinja/objects.h"

namespace m3::jinja {
namespace {

// Deep enough for recursive macros over nested tool arguments, shallow enough for a thread's
// stack (Python's own limit stops jinja2 a few hundred macro calls deep).
constexpr int kMaxCallDepth = 400;

class Macro : public Object {
 public:
  Macro(const MacroDef& def, ScopePtr closure) : def_(def), closure_(std::move(closure)) {}
  const char* type_name() const override { return "Macro"; }
  std::string repr() const override { return fmt::format("<Macro '{}'>", def_.name); }
  bool callable() const override { return true; }
  Value call(Interpreter& interp, CallArgs& args) override {
    return interp.call_macro(def_, closure_, args);
  }
  bool get_attr(std::string_view name, Value& out) override {
    if (name == "name") {
      out = Value::string(def_.name);
    } else if (name == "arguments") {
      std::vector<Value> names;
      for (const std::string& p : def_.params) names.push_back(Value::string(p));
      out = make_tuple(std::move(names));
    } else if (name == "catch_kwargs") {
      out = Value::boolean(def_.uses_kwargs);
    } else if (name == "catch_varargs") {
      out = Value::boolean(def_.uses_varargs);
    } else if (name == "caller") {
      out = Value::boolean(def_.uses_caller);
    } else {
      return false;
    }
    return true;
  }

 private:
  const MacroDef& def_;
  ScopePtr closure_;
};

// jinja2's LoopContext: index/index0/revindex/first/last/length/previtem/nextitem/depth,
// cycle() and changed(), and loop(...) in recursive loops.
class LoopContext : public Object, public std::enable_shared_from_this<LoopContext> {
 public:
  LoopContext(std::shared_ptr<ListData> items, int depth0, const ForStmt* recursive_stmt, ScopePtr scope)
      : items_(std::move(items)), depth0_(depth0), stmt_(recursive_stmt), scope_(std::move(scope)) {}

  size_t index0 = 0;

  const char* type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return fmt::format("<LoopContext {}/{}>", index0 + 1, items_->items.size());
  }
  bool has_length() const override { return true; }
  int64_t length() const override { return static_cast<int64_t>(items_->items.size()); }
  bool callable() const override { return true; }
  Value call(Interpreter& interp, CallArgs& args) override {
    if (stmt_ == nullptr) {
      throw_error("TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    }
    std::vector<Value> v = bind_args("loop", args, {{"iterable", true}});
    return interp.run_loop(*stmt_, scope_, v[0], depth0_ + 1);
  }

  bool get_attr(std::string_view name, Value& out) override {
    const std::vector<Value>& items = items_->items;
    int64_t n = static_cast<int64_t>(items.size());
    int64_t i = static_cast<int64_t>(index0);
    if (name == "index") {
      out = Value::integer(i + 1);
    } else if (name == "index0") {
      out = Value::integer(i);
    } else if (name == "revindex") {
      out = Value::integer(n - i);
    } else if (name == "revindex0") {
      out = Value::integer(n - i - 1);
    } else if (name == "first") {
      out = Value::boolean(i == 0);
    } else if (name == "last") {
      out = Value::boolean(i + 1 == n);
    } else if (name == "length") {
      out = Value::integer(n);
    } else if (name == "depth") {
      out = Value::integer(depth0_ + 1);
    } else if (name == "depth0") {
      out = Value::integer(depth0_);
    } else if (name == "previtem") {
      out = i > 0 && i - 1 < n ? items[i - 1] : Value::undefined("there is no previous item");
    } else if (name == "nextitem") {
      out = i + 1 < n ? items[i + 1] : Value::undefined("there is no next item");
    } else if (name == "cycle") {
      auto self = shared_from_this();
      out = make_function("cycle", [self](Interpreter&, CallArgs& args) {
        if (args.positional.empty()) throw_error("TypeError", "no items for cycling given");
        return args.positional[self->index0 % args.positional.size()];
      }, "method");
    } else if (name == "changed") {
      auto self = shared_from_this();
      out = make_function("changed", [self](Interpreter&, CallArgs& args) {
        Value current = make_tuple(args.positional);
        if (self->has_last_changed_ && equals(self->last_changed_, current)) return Value::boolean(false);
        self->last_changed_ = current;
        self->has_last_changed_ = true;
        return Value::boolean(true);
      }, "method");
    } else {
      return false;
    }
    return true;
  }

 private:
  std::shared_ptr<ListData> items_;
  int depth0_;
  const ForStmt* stmt_;
  ScopePtr scope_;
  Value last_changed_;
  bool has_last_changed_ = false;
};


}  // namespace

// ---- scope ---------------------------------------------------------------------------------

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
    for (size_t k = 0; k < s->inline_count_; ++k) {
      if (s->inline_[k].first == name) return &s->inline_[k].second;
    }
    for (const auto& [key, value] : s->more_) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  for (size_t k = 0; k < inline_count_; ++k) {
    if (inline_[k].first == name) {
      inline_[k].second = std::move(value);
      return;
    }
  }
  for (auto& [key, existing] : more_) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  if (inline_count_ < kInline) {
    inline_[inline_count_++] = {name, std::move(value)};
  } else {
    more_.emplace_back(name, std::move(value));
  }
}

void Scope::clear() {
  for (size_t k = 0; k < inline_count_; ++k) inline_[k].second = Value();
  inline_count_ = 0;
  more_.clear();
}

// ---- rendering -----------------------------------------------------------------------------

Interpreter::~Interpreter() {
  for (const ScopePtr& scope : captured_scopes_) scope->clear();
  for (const auto& ns : namespaces_) ns->attrs.entries.clear();
}

std::shared_ptr<Namespace> Interpreter::new_namespace() {
  auto ns = std::make_shared<Namespace>();
  namespaces_.push_back(ns);
  return ns;
}

std::string Interpreter::render(const TemplateAst& ast, const ScopePtr& root) {
  std::string out;
  exec(ast.body, root, out);
  return out;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& stmt : body) {
    Flow flow = exec_stmt(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

std::string Interpreter::capture(const Body& body, const ScopePtr& parent) {
  std::string out;
  exec(body, std::make_shared<Scope>(parent), out);
  return out;
}

Value Interpreter::make_macro(const MacroDef& def, const ScopePtr& scope) {
  captured_scopes_.push_back(scope);
  return Value::object(std::make_shared<Macro>(def, scope));
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  try {
    switch (stmt.kind) {
      case StmtKind::kOutput:
        for (const auto& part : static_cast<const OutputStmt&>(stmt).parts) {
          if (part.expr) {
            Value storage;
            append_str(out, eval_ref(*part.expr, scope, storage));
          } else {
            out += part.text;
          }
        }
        return Flow::kNormal;
      case StmtKind::kIf: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [test, body] : s.branches) {
          Value storage;
          if (truthy(eval_ref(*test, scope, storage))) return exec(body, scope, out);
        }
        return exec(s.else_body, scope, out);
      }
      case StmtKind::kFor: {
        const auto& s = static_cast<const ForStmt&>(stmt);
        exec_for(s, scope, eval(*s.iter, scope), 0, out);
        return Flow::kNormal;
      }
      case StmtKind::kSet: {
        const auto& s = static_cast<const SetStmt&>(stmt);
        assign(s.target, eval(*s.value, scope), scope);
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        const auto& s = static_cast<const SetBlockStmt&>(stmt);
        Value text = Value::string(capture(s.body, scope));
        if (s.filter) text = apply_filter(static_cast<const FilterExpr&>(*s.filter), scope, &text);
        assign(s.target, std::move(text), scope);
        return Flow::kNormal;
      }
      case StmtKind::kMacro: {
        const auto& s = static_cast<const MacroStmt&>(stmt);
        scope->set(s.def.name, make_macro(s.def, scope));
        return Flow::kNormal;
      }
      case StmtKind::kCallBlock: {
        const auto& s = static_cast<const CallBlockStmt&>(stmt);
        Value callee = eval(*s.call->callee, scope);
        CallArgs args = eval_args(s.call->args, scope);
        args.keyword.emplace_back("caller", make_macro(s.caller, scope));
        append_str(out, call(callee, args));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        const auto& s = static_cast<const FilterBlockStmt&>(stmt);
        Value text = Value::string(capture(s.body, scope));
        append_str(out, apply_filter(static_cast<const FilterExpr&>(*s.filter), scope, &text));
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        const auto& s = static_cast<const WithStmt&>(stmt);
        std::vector<Value> values;
        for (const auto& [target, expr] : s.assignments) values.push_back(eval(*expr, scope));
        auto inner = std::make_shared<Scope>(scope);
        for (size_t k = 0; k < values.size(); ++k) assign(s.assignments[k].first, values[k], inner);
        return exec(s.body, inner, out);
      }
      case StmtKind::kScope:
        out += capture(static_cast<const ScopeStmt&>(stmt).body, scope);
        return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
  } catch (RenderError& e) {
    if (e.line == 0) e.line = stmt.line;
    throw;
  }
  return Flow::kNormal;
}

Value Interpreter::run_loop(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable,
                            int depth0) {
  std::string out;
  exec_for(stmt, scope, iterable, depth0, out);
  return Value::string(std::move(out));
}

void Interpreter::exec_for(const ForStmt& stmt, const ScopePtr& scope, const Value& iterable,
                           int depth0, std::string& out) {
  // A list is iterated in place, as Python's list iterator does; anything else is listed first.
  std::shared_ptr<ListData> items;
  if (iterable.is_list() && !stmt.filter) {
    items = iterable.list_ptr();
  } else {
    items = std::make_shared<ListData>();
    items->items = iterate(iterable);
  }
  if (stmt.filter) {
    std::vector<Value> kept;
    for (Value& item : items->items) {
      auto test_scope = std::make_shared<Scope>(scope);
      assign(stmt.target, item, test_scope);
      if (truthy(eval(*stmt.filter, test_scope))) kept.push_back(std::move(item));
    }
    items->items = std::move(kept);
  }
  if (items->items.empty()) {
    exec(stmt.else_body, std::make_shared<Scope>(scope), out);
    return;
  }
  if (stmt.recursive) captured_scopes_.push_back(scope);
  auto loop = std::make_shared<LoopContext>(items, depth0, stmt.recursive ? &stmt : nullptr,
                                            stmt.recursive ? scope : nullptr);
  Value loop_value = Value::object(loop);
  ScopePtr iteration;
  for (size_t k = 0; k < items->items.size(); ++k) {
    // Each iteration starts from the enclosing scope again; reuse the scope object unless a
    // macro defined in the last iteration still holds it.
    if (!iteration || iteration.use_count() > 1) {
      iteration = std::make_shared<Scope>(scope);
    } else {
      iteration->clear();
    }
    loop->index0 = k;
    iteration->set("loop", loop_value);
    assign(stmt.target, items->items[k], iteration);
    if (exec(stmt.body, iteration, out) == Flow::kBreak) break;
  }
}

void Interpreter::assign(const Target& target, Value value, const ScopePtr& scope) {
  switch (target.kind) {
    case Target::Kind::kName: scope->set(target.name, std::move(value)); return;
    case Target::Kind::kTuple: {
      // Pairs from items() and the like are lists already: unpack them without a copy.
      std::vector<Value> listed;
      const std::vector<Value>& items = value.is_list() ? value.list().items : (listed = iterate(value));
      size_t want = target.items.size();
      if (items.size() < want) {
        throw_error("ValueError", fmt::format("not enough values to unpack (expected {}, got {})",
                                              want, items.size()));
      }
      if (items.size() > want) {
        throw_error("ValueError", fmt::format("too many values to unpack (expected {})", want));
      }
      for (size_t k = 0; k < want; ++k) assign(target.items[k], items[k], scope);
      return;
    }
    case Target::Kind::kNamespaceAttr: {
      const Value* ns = scope->find(target.name);
      if (ns == nullptr || !ns->is_object() || std::string_view(ns->object().type_name()) != "Namespace") {
        throw_error("TemplateRuntimeError", "Cannot assign attribute on non-namespace object");
      }
      static_cast<Namespace&>(ns->object()).attrs.set(Value::string(target.attr), std::move(value));
      return;
    }
  }
}

Value Interpreter::call_macro(const MacroDef& def, const ScopePtr& closure, CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth) {
    throw_error("RecursionError", fmt::format("macro '{}' nested more than {} calls deep", def.name,
                                              kMaxCallDepth));
  }
  auto scope = std::make_shared<Scope>(closure);
  size_t n_params = def.params.size();
  // Positional arguments first, then keywords by name (jinja2's Macro.__call__).
  Kwargs keyword = std::move(args.keyword);
  auto take_keyword = [&](std::string_view name, Value& out) {
    for (auto it = keyword.begin(); it != keyword.end(); ++it) {
      if (it->first == name) {
        out = std::move(it->second);
        keyword.erase(it);
        return true;
      }
    }
    return false;
  };
  size_t first_default = n_params - def.defaults.size();
  for (size_t k = 0; k < n_params; ++k) {
    Value value;
    if (k < args.positional.size()) {
      value = args.positional[k];
    } else if (!take_keyword(def.params[k], value)) {
      if (k >= first_default) {
        value = eval(*def.defaults[k - first_default], scope);  // may use earlier parameters
      } else {
        value = Value::undefined(fmt::format("parameter '{}' was not provided", def.params[k]));
      }
    }
    scope->set(def.params[k], std::move(value));
  }
  bool explicit_caller = false;
  for (const std::string& p : def.params) explicit_caller = explicit_caller || p == "caller";
  if (def.uses_caller && !explicit_caller) {
    Value caller;
    if (!take_keyword("caller", caller)) caller = Value::undefined("No caller defined");
    scope->set("caller", std::move(caller));
  }
  if (def.uses_kwargs) {
    auto dict = std::make_shared<DictData>();
    for (auto& [name, value] : keyword) dict->entries.emplace_back(Value::string(name), std::move(value));
    scope->set("kwargs", Value::dict(std::move(dict)));
  } else if (!keyword.empty()) {
    if (keyword.front().first == "caller") {
      throw_error("TypeError", fmt::format("macro '{}' was invoked with two values for the special "
                                           "caller argument. This is most likely a bug.", def.name));
    }
    throw_error("TypeError", fmt::format("macro '{}' takes no keyword argument '{}'", def.name,
                                         keyword.front().first));
  }
  if (def.uses_varargs) {
    std::vector<Value> rest;
    for (size_t k = n_params; k < args.positional.size(); ++k) rest.push_back(args.positional[k]);
    scope->set("varargs", make_tuple(std::move(rest)));
  } else if (args.positional.size() > n_params) {
    throw_error("TypeError", fmt::format("macro '{}' takes not more than {} argument(s)", def.name,
                                         n_params));
  }
  ++call_depth_;
  std::string out;
  out.reserve(256);
  try {
    exec(def.body, scope, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value::string(std::move(out));
}

}  // namespace m3::jinja
