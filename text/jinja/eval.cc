// Expression evaluation: operators, attribute and item access, calls, filters and tests.
#include <fmt/format.h>

#include "text/jinja/interpreter.h"

namespace m3::jinja {

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) callee.raise_undefined();
  if (!callee.is_object() || !callee.object().callable()) {
    throw_error("TypeError", fmt::format("'{}' object is not callable", type_name(callee)));
  }
  return callee.object().call(*this, args);
}

CallArgs Interpreter::eval_args(const CallArgsExpr& args, const ScopePtr& scope) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& e : args.positional) out.positional.push_back(eval(*e, scope));
  for (const auto& [name, e] : args.keyword) out.keyword.emplace_back(name, eval(*e, scope));
  if (args.star_args) {
    for (Value& v : iterate(eval(*args.star_args, scope))) out.positional.push_back(std::move(v));
  }
  if (args.star_kwargs) {
    Value kwargs = eval(*args.star_kwargs, scope);
    if (!kwargs.is_dict()) {
      throw_error("TypeError", fmt::format("argument after ** must be a mapping, not {}", type_name(kwargs)));
    }
    for (const auto& [k, v] : kwargs.dict().entries) {
      if (!k.is_string()) throw_error("TypeError", "keywords must be strings");
      out.keyword.emplace_back(k.str(), v);
    }
  }
  return out;
}

Value Interpreter::apply_filter(const FilterExpr& filter, const ScopePtr& scope, const Value* block_input) {
  // In {% filter %} and {% set x | f %} blocks the innermost filter of the chain takes the
  // rendered block as its input.
  Value input;
  if (filter.input && block_input && filter.input->kind == ExprKind::kFilter) {
    input = apply_filter(static_cast<const FilterExpr&>(*filter.input), scope, block_input);
  } else if (filter.input) {
    input = eval(*filter.input, scope);
  } else if (block_input) {
    input = *block_input;
  }
  if (filter.fn == nullptr) {
    throw_error("TemplateRuntimeError",
                filter.unknown ? fmt::format("No filter named '{}' found.", filter.name)
                               : fmt::format("the '{}' filter is not supported by m3serve's chat "
                                             "template interpreter", filter.name));
  }
  CallArgs args = eval_args(filter.args, scope);
  return filter.fn(*this, input, args);
}

const Value& Interpreter::eval_ref(const Expr& expr, const ScopePtr& scope, Value& storage) {
  if (expr.kind == ExprKind::kName) {
    const auto& name = static_cast<const NameExpr&>(expr).name;
    if (const Value* value = scope->find(name)) return *value;
    storage = Value::undefined_template_name(name);
    return storage;
  }
  if (expr.kind == ExprKind::kConst) return static_cast<const ConstExpr&>(expr).value;
  storage = eval(expr, scope);
  return storage;
}

Value Interpreter::eval(const Expr& expr, const ScopePtr& scope) {
  try {
    return eval_uncaught(expr, scope);
  } catch (RenderError& e) {
    if (e.line == 0) e.line = expr.line;
    throw;
  }
}

Value Interpreter::eval_uncaught(const Expr& expr, const ScopePtr& scope) {
  switch (expr.kind) {
    case ExprKind::kConst: return static_cast<const ConstExpr&>(expr).value;
    case ExprKind::kName: {
      const auto& name = static_cast<const NameExpr&>(expr).name;
      const Value* value = scope->find(name);
      return value ? *value : Value::undefined_template_name(name);
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      const auto& seq = static_cast<const SequenceExpr&>(expr);
      std::vector<Value> items;
      items.reserve(seq.items.size());
      for (const ExprPtr& item : seq.items) items.push_back(eval(*item, scope));
      return Value::list(std::move(items),
                         expr.kind == ExprKind::kTuple ? ListFlavor::kTuple : ListFlavor::kList);
    }
    case ExprKind::kDict: {
      auto dict = std::make_shared<DictData>();
      for (const auto& [k, v] : static_cast<const DictExpr&>(expr).items) {
        Value key = eval(*k, scope);
        dict->set(std::move(key), eval(*v, scope));
      }
      return Value::dict(std::move(dict));
    }
    case ExprKind::kGetattr: {
      const auto& e = static_cast<const GetattrExpr&>(expr);
      Value storage, out;
      const Value& object = eval_ref(*e.object, scope, storage);
      if (try_get_attr(object, e.attr, out)) return out;
      return Value::missing_template_attribute(type_name(object), e.attr);
    }
    case ExprKind::kGetitem: {
      const auto& e = static_cast<const GetitemExpr&>(expr);
      Value storage;
      const Value& object = eval_ref(*e.object, scope, storage);
      if (e.index->kind == ExprKind::kSlice) {
        const auto& s = static_cast<const SliceExpr&>(*e.index);
        Value none = Value::none();
        return get_slice(object, s.start ? eval(*s.start, scope) : none,
                         s.stop ? eval(*s.stop, scope) : none, s.step ? eval(*s.step, scope) : none);
      }
      return get_item(object, eval(*e.index, scope));
    }
    case ExprKind::kSlice: throw_error("TypeError", "a slice is only valid inside []");
    case ExprKind::kCall: {
      const auto& e = static_cast<const CallExpr&>(expr);
      Value callee = eval(*e.callee, scope);
      CallArgs args = eval_args(e.args, scope);
      return call(callee, args);
    }
    case ExprKind::kFilter: return apply_filter(static_cast<const FilterExpr&>(expr), scope, nullptr);
    case ExprKind::kTest: {
      const auto& e = static_cast<const TestExpr&>(expr);
      Value storage;
      const Value& input = eval_ref(*e.input, scope, storage);
      if (e.fn == nullptr) {
        throw_error("TemplateRuntimeError", fmt::format("No test named '{}' found.", e.name));
      }
      CallArgs args = eval_args(e.args, scope);
      return Value::boolean(e.fn(*this, input, args));
    }
    case ExprKind::kNeg: return op_neg(eval(*static_cast<const UnaryExpr&>(expr).operand, scope));
    case ExprKind::kPos: return op_pos(eval(*static_cast<const UnaryExpr&>(expr).operand, scope));
    case ExprKind::kNot: {
      Value storage;
      return Value::boolean(!truthy(eval_ref(*static_cast<const UnaryExpr&>(expr).operand, scope, storage)));
    }
    case ExprKind::kAnd: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left, scope);
      return truthy(left) ? eval(*e.right, scope) : left;
    }
    case ExprKind::kOr: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left, scope);
      return truthy(left) ? left : eval(*e.right, scope);
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left, scope);
      Value right = eval(*e.right, scope);
      switch (e.op) {
        case BinaryOp::kAdd: return op_add(left, right);
        case BinaryOp::kSub: return op_sub(left, right);
        case BinaryOp::kMul: return op_mul(left, right);
        case BinaryOp::kDiv: return op_truediv(left, right);
        case BinaryOp::kFloorDiv: return op_floordiv(left, right);
        case BinaryOp::kMod: return op_mod(left, right);
        case BinaryOp::kPow: return op_pow(left, right);
      }
      break;
    }
    case ExprKind::kConcat: {
      // Evaluate first, then build the string in one allocation.
      const auto& parts = static_cast<const ConcatExpr&>(expr).parts;
      std::vector<Value> values;
      values.reserve(parts.size());
      size_t bytes = 0;
      for (const ExprPtr& part : parts) {
        values.push_back(eval(*part, scope));
        if (values.back().is_string()) bytes += values.back().str().size();
      }
      std::string out;
      out.reserve(bytes + 16);
      for (const Value& v : values) append_str(out, v);
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare: {
      const auto& e = static_cast<const CompareExpr&>(expr);
      Value left = eval(*e.first, scope);
      for (const auto& [op, right_expr] : e.rest) {
        Value right_storage;
        const Value& right = eval_ref(*right_expr, scope, right_storage);
        bool ok = false;
        switch (op) {
          case CompareOp::kEq: ok = equals(left, right); break;
          case CompareOp::kNe: ok = !equals(left, right); break;
          case CompareOp::kLt: ok = ordered_compare("<", left, right); break;
          case CompareOp::kLe: ok = ordered_compare("<=", left, right); break;
          case CompareOp::kGt: ok = ordered_compare(">", left, right); break;
          case CompareOp::kGe: ok = ordered_compare(">=", left, right); break;
          case CompareOp::kIn: ok = op_contains(right, left); break;
          case CompareOp::kNotIn: ok = !op_contains(right, left); break;
        }
        if (!ok) return Value::boolean(false);
        left = right;
      }
      return Value::boolean(true);
    }
    case ExprKind::kCondExpr: {
      const auto& e = static_cast<const CondExpr&>(expr);
      if (truthy(eval(*e.test, scope))) return eval(*e.then_expr, scope);
      if (e.else_expr) return eval(*e.else_expr, scope);
      return Value::undefined(fmt::format("the inline if-expression on line {} evaluated to false and "
                                          "no else section was defined.", expr.line));
    }
  }
  throw_error("TemplateRuntimeError", "unknown expression");
}

}  // namespace m3::jinja
