// Operators, iteration, indexing and attribute access with Python's (and jinja2's sandbox)
// semantics.
#include <fmt/format.h>

#include <cmath>

#include "text/jinja/methods.h"
#include "text/jinja/pystr.h"
#include "text/jinja/value.h"

namespace m3::jinja {
namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  throw_error("TypeError", fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                                       type_name(a), type_name(b)));
}

void check_defined(const Value& a, const Value& b) {
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
}

[[noreturn]] void overflow() {
  throw_error("OverflowError", "integer result out of the 64-bit range this interpreter supports");
}

bool is_sequence_like(const Value& v) {
  return v.is_flavor(ListFlavor::kList) || v.is_flavor(ListFlavor::kTuple);
}

Value repeat(const Value& seq, int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.str();
    return Value::string(std::move(out));
  }
  std::vector<Value> items;
  for (int64_t k = 0; k < times; ++k) {
    items.insert(items.end(), seq.list().items.begin(), seq.list().items.end());
  }
  return Value::list(std::move(items), seq.list().flavor);
}

// Python's float floor division and modulo (signs follow the divisor).
void float_divmod(double x, double y, double& div_out, double& mod_out) {
  if (y == 0.0) throw_error("ZeroDivisionError", "float division by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0.0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  div_out = floordiv;
  mod_out = mod;
}

void int_divmod(int64_t x, int64_t y, int64_t& div, int64_t& mod) {
  if (y == 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
  if (x == INT64_MIN && y == -1) overflow();
  div = x / y;
  mod = x % y;
  if (mod != 0 && ((mod < 0) != (y < 0))) {
    mod += y;
    div -= 1;
  }
}

// Python's index normalisation for seq[i]; false when out of range.
bool normalize_index(int64_t& index, int64_t size) {
  if (index < 0) index += size;
  return index >= 0 && index < size;
}

std::string object_type_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return fmt::format("{} object", type_name(obj));
}

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::missing_attribute(type_name(obj), name);
}

Value missing_item(const Value& obj, const Value& key) {
  if (key.is_string()) return missing_attribute(obj, key.str());
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), repr(key)));
}

int64_t slice_index(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw_error("TypeError", fmt::format("slice {} must be integers or None or have an "
                                         "__index__ method", what));
  }
  return v.as_int();
}

}  // namespace

Value op_add(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() + b.as_float());
  if (a.is_string() && b.is_string()) return Value::string(a.str() + b.str());
  if (is_sequence_like(a) && is_sequence_like(b) && a.list().flavor == b.list().flavor) {
    std::vector<Value> items = a.list().items;
    items.insert(items.end(), b.list().items.begin(), b.list().items.end());
    return Value::list(std::move(items), a.list().flavor);
  }
  if (a.is_string() || is_sequence_like(a)) {
    throw_error("TypeError", fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a),
                                         type_name(b), type_name(a)));
  }
  unsupported("+", a, b);
}

Value op_sub(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() - b.as_float());
  unsupported("-", a, b);
}

Value op_mul(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() * b.as_float());
  if ((a.is_string() || is_sequence_like(a)) && b.is_integral()) return repeat(a, b.as_int());
  if ((b.is_string() || is_sequence_like(b)) && a.is_integral()) return repeat(b, a.as_int());
  if (a.is_string() || is_sequence_like(a) || b.is_string() || is_sequence_like(b)) {
    const Value& other = a.is_string() || is_sequence_like(a) ? b : a;
    throw_error("TypeError", fmt::format("can't multiply sequence by non-int of type '{}'",
                                         type_name(other)));
  }
  unsupported("*", a, b);
}

Value op_truediv(const Value& a, const Value& b) {
  check_defined(a, b);
  if (!a.is_number() || !b.is_number()) unsupported("/", a, b);
  if (b.as_float() == 0.0) {
    throw_error("ZeroDivisionError", b.is_float() ? "float division by zero" : "division by zero");
  }
  return Value::number(a.as_float() / b.as_float());
}

Value op_floordiv(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_integral() && b.is_integral()) {
    int64_t div, mod;
    int_divmod(a.as_int(), b.as_int(), div, mod);
    return Value::integer(div);
  }
  if (!a.is_number() || !b.is_number()) unsupported("//", a, b);
  double div, mod;
  float_divmod(a.as_float(), b.as_float(), div, mod);
  return Value::number(div);
}

Value op_mod(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_string()) return Value::string(percent_format(a.str(), b));
  if (a.is_integral() && b.is_integral()) {
    int64_t div, mod;
    int_divmod(a.as_int(), b.as_int(), div, mod);
    return Value::integer(mod);
  }
  if (!a.is_number() || !b.is_number()) unsupported("%", a, b);
  if (b.as_float() == 0.0) throw_error("ZeroDivisionError", "float modulo");
  double div, mod;
  float_divmod(a.as_float(), b.as_float(), div, mod);
  return Value::number(mod);
}

Value op_pow(const Value& a, const Value& b) {
  check_defined(a, b);
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (a.is_integral() && b.is_integral() && b.as_int() >= 0) {
    int64_t base = a.as_int(), exp = b.as_int(), result = 1;
    while (exp > 0) {
      if (exp & 1) {
        if (__builtin_mul_overflow(result, base, &result)) overflow();
      }
      exp >>= 1;
      if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return Value::integer(result);
  }
  if (a.as_float() == 0.0 && b.as_float() < 0) {
    throw_error("ZeroDivisionError", "0.0 cannot be raised to a negative power");
  }
  return Value::number(std::pow(a.as_float(), b.as_float()));
}

Value op_neg(const Value& a) {
  if (a.is_undefined()) a.raise_undefined();
  if (a.is_integral()) {
    if (a.as_int() == INT64_MIN) overflow();
    return Value::integer(-a.as_int());
  }
  if (a.is_float()) return Value::number(-a.as_float());
  throw_error("TypeError", fmt::format("bad operand type for unary -: '{}'", type_name(a)));
}

Value op_pos(const Value& a) {
  if (a.is_undefined()) a.raise_undefined();
  if (a.is_integral()) return Value::integer(a.as_int());
  if (a.is_float()) return a;
  throw_error("TypeError", fmt::format("bad operand type for unary +: '{}'", type_name(a)));
}

bool op_contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;  // Undefined iterates as empty
    case Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) item.raise_undefined();
        throw_error("TypeError", fmt::format("'in <string>' requires string as left operand, not {}",
                                             type_name(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kDict: return container.dict().find(item) != nullptr;
    case Kind::kList:
      for (const Value& x : container.list().items) {
        if (equals(x, item)) return true;
      }
      return false;
    case Kind::kObject:
      for (const Value& x : container.object().iterate()) {
        if (equals(x, item)) return true;
      }
      return false;
    default:
      throw_error("TypeError",
                  fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

bool is_iterable(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kString:
    case Kind::kList:
    case Kind::kDict: return true;
    case Kind::kObject: return v.object().iterable();
    default: return false;
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList: return v.list().items;
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().entries.size());
      for (const auto& [k, item] : v.dict().entries) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      std::string ch;
      for (char32_t c : pystr::decode(v.str())) {
        ch.clear();
        pystr::append_utf8(ch, c);
        chars.push_back(Value::string(ch));
      }
      return chars;
    }
    case Kind::kObject: return v.object().iterate();
    default:
      throw_error("TypeError", fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(pystr::length(v.str()));
    case Kind::kList: return static_cast<int64_t>(v.list().items.size());
    case Kind::kDict: return static_cast<int64_t>(v.dict().entries.size());
    case Kind::kObject:
      if (v.object().has_length()) return v.object().length();
      [[fallthrough]];
    default:
      throw_error("TypeError", fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

bool try_get_attr(const Value& obj, std::string_view name, Value& out) {
  if (obj.is_undefined()) obj.raise_undefined();
  if (!name.empty() && name[0] == '_') {
    // The sandbox hides private and dunder attributes.
    if (obj.is_dict()) {
      if (const Value* item = obj.dict().find(name)) {
        out = *item;
        return true;
      }
    }
    out = Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name,
                                       type_name(obj)),
                           /*unsafe=*/true);
    return true;
  }
  if (obj.is_object()) {
    if (obj.object().get_attr(name, out)) return true;
  } else if (lookup_method(obj, name, out)) {
    return true;
  }
  if (obj.is_dict()) {
    if (const Value* item = obj.dict().find(name)) {
      out = *item;
      return true;
    }
  }
  return false;
}

Value get_attr(const Value& obj, std::string_view name) {
  Value out;
  if (try_get_attr(obj, name, out)) return out;
  return missing_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.raise_undefined();
  switch (obj.kind()) {
    case Kind::kDict:
      if (key.is_dict() || (key.is_list() && !key.is_flavor(ListFlavor::kTuple))) break;
      if (const Value* item = obj.dict().find(key)) return *item;
      break;
    case Kind::kList: {
      ListFlavor flavor = obj.list().flavor;
      bool indexable = flavor == ListFlavor::kList || flavor == ListFlavor::kTuple ||
                       flavor == ListFlavor::kRange;
      if (indexable && key.is_integral()) {
        int64_t index = key.as_int();
        if (normalize_index(index, static_cast<int64_t>(obj.list().items.size()))) {
          return obj.list().items[index];
        }
      }
      break;
    }
    case Kind::kString:
      if (key.is_integral()) {
        std::u32string s = pystr::decode(obj.str());
        int64_t index = key.as_int();
        if (normalize_index(index, static_cast<int64_t>(s.size()))) {
          std::string ch;
          pystr::append_utf8(ch, s[index]);
          return Value::string(std::move(ch));
        }
      }
      break;
    default: break;
  }
  // jinja2 falls back to the attribute of that name (so d['items'] is the method).
  if (key.is_string()) {
    Value out;
    if (obj.is_object() ? obj.object().get_attr(key.str(), out) : lookup_method(obj, key.str(), out)) {
      return out;
    }
  }
  return missing_item(obj, key);
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) obj.raise_undefined();
  bool is_str = obj.is_string();
  bool is_seq = obj.is_flavor(ListFlavor::kList) || obj.is_flavor(ListFlavor::kTuple) ||
                obj.is_flavor(ListFlavor::kRange);
  if (!is_str && !is_seq) {
    return Value::undefined(fmt::format("{} has no element slice", object_type_repr(obj)));
  }
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : slice_index(step_v, "indices");
  if (step == 0) throw_error("ValueError", "slice step cannot be zero");
  std::u32string chars;
  int64_t size;
  if (is_str) {
    chars = pystr::decode(obj.str());
    size = static_cast<int64_t>(chars.size());
  } else {
    size = static_cast<int64_t>(obj.list().items.size());
  }
  // PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t default_value) {
    if (v.is_none() || v.is_undefined()) return default_value;
    int64_t i = slice_index(v, "indices");
    if (i < 0) {
      i += size;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= size) {
      i = step < 0 ? size - 1 : size;
    }
    return i;
  };
  int64_t start = adjust(start_v, step < 0 ? size - 1 : 0);
  int64_t stop = adjust(stop_v, step < 0 ? -1 : size);
  std::vector<int64_t> indices;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) indices.push_back(i);
  if (is_str) {
    std::u32string out;
    for (int64_t i : indices) out.push_back(chars[i]);
    return Value::string(pystr::encode(out));
  }
  std::vector<Value> items;
  items.reserve(indices.size());
  for (int64_t i : indices) items.push_back(obj.list().items[i]);
  ListFlavor flavor = obj.list().flavor == ListFlavor::kTuple ? ListFlavor::kTuple : ListFlavor::kList;
  if (obj.list().flavor == ListFlavor::kRange) {
    // A slice of a range is a range; keep printing it as one.
    auto data = std::make_shared<ListData>();
    data->items = std::move(items);
    data->flavor = ListFlavor::kRange;
    const ListData& r = obj.list();
    data->range_step = r.range_step * step;
    data->range_start = r.range_start + start * r.range_step;
    data->range_stop = r.range_start + stop * r.range_step;
    return Value::list(std::move(data));
  }
  return Value::list(std::move(items), flavor);
}

}  // namespace m3::jinja
