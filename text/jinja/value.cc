#include "text/jinja/value.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "text/jinja/pystr.h"

namespace m3::jinja {

void throw_error(const char* type, std::string message) { throw RenderError(type, message); }

Value Value::undefined(std::string message, bool unsafe) {
  Value v;
  auto data = std::make_shared<UndefinedData>();
  data->text = std::move(message);
  data->unsafe = unsafe;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::undefined_name(std::string_view name) {
  Value v;
  auto data = std::make_shared<UndefinedData>();
  data->reason = UndefinedData::Reason::kName;
  data->text = name;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::missing_attribute(const char* owner_type, std::string_view name) {
  Value v;
  auto data = std::make_shared<UndefinedData>();
  data->reason = UndefinedData::Reason::kAttribute;
  data->text = name;
  data->owner = owner_type;
  v.ptr_ = std::move(data);
  return v;
}

namespace {

std::shared_ptr<void> borrow(const std::string& s) {
  // The aliasing constructor with an empty owner: a pointer without a control block.
  return std::shared_ptr<void>(std::shared_ptr<void>(), const_cast<std::string*>(&s));
}

std::string attribute_message(const char* owner, std::string_view name) {
  // jinja2's object_type_repr: "None", else "<type> object".
  if (std::string_view(owner) == "NoneType") return fmt::format("'None' has no attribute '{}'", name);
  return fmt::format("'{} object' has no attribute '{}'", owner, name);
}

}  // namespace

Value Value::undefined_template_name(const std::string& name) {
  Value v;
  v.borrowed_undefined_ = BorrowedUndefined::kName;
  v.ptr_ = borrow(name);
  return v;
}

Value Value::missing_template_attribute(const char* owner_type, const std::string& name) {
  Value v;
  v.borrowed_undefined_ = BorrowedUndefined::kAttribute;
  v.scalar_.owner = owner_type;
  v.ptr_ = borrow(name);
  return v;
}

std::string Value::undefined_message() const {
  switch (borrowed_undefined_) {
    case BorrowedUndefined::kName: return fmt::format("'{}' is undefined", str());
    case BorrowedUndefined::kAttribute: return attribute_message(scalar_.owner, str());
    case BorrowedUndefined::kNone: break;
  }
  const auto* data = static_cast<const UndefinedData*>(ptr_.get());
  if (data == nullptr) return "value is undefined";
  switch (data->reason) {
    case UndefinedData::Reason::kName: return fmt::format("'{}' is undefined", data->text);
    case UndefinedData::Reason::kAttribute: return attribute_message(data->owner, data->text);
    case UndefinedData::Reason::kMessage: break;
  }
  return data->text;
}

bool Value::undefined_is_unsafe() const {
  if (borrowed_undefined_ != BorrowedUndefined::kNone) return false;
  const auto* data = static_cast<const UndefinedData*>(ptr_.get());
  return data != nullptr && data->unsafe;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.scalar_.b = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.scalar_.i = i;
  return v;
}

Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.scalar_.f = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::borrowed_string(const std::string& s) {
  Value v;
  v.kind_ = Kind::kString;
  v.ptr_ = borrow(s);
  return v;
}

Value Value::list(std::vector<Value> items, ListFlavor flavor) {
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->flavor = flavor;
  return list(std::move(data));
}

Value Value::list(std::shared_ptr<ListData> data) {
  Value v;
  v.kind_ = Kind::kList;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::dict(std::shared_ptr<DictData> data) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::object(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.ptr_ = std::move(object);
  return v;
}

void Value::raise_undefined() const {
  throw_error(undefined_is_unsafe() ? "SecurityError" : "UndefinedError", undefined_message());
}

Value make_tuple(std::vector<Value> items) { return Value::list(std::move(items), ListFlavor::kTuple); }

// ---- dict ----------------------------------------------------------------------------------

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  check_hashable(key);
  for (const auto& [k, v] : entries) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  if (const Value* existing = find(key)) {
    *const_cast<Value*>(existing) = std::move(value);
    return;
  }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---- objects -------------------------------------------------------------------------------

std::string Object::repr() const { return fmt::format("<{} object>", type_name()); }
bool Object::get_attr(std::string_view, Value&) { return false; }
Value Object::call(Interpreter&, CallArgs&) {
  throw_error("TypeError", fmt::format("'{}' object is not callable", type_name()));
}
std::vector<Value> Object::iterate() {
  throw_error("TypeError", fmt::format("'{}' object is not iterable", type_name()));
}

// ---- Python semantics ----------------------------------------------------------------------

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kDict: return "dict";
    case Kind::kObject: return v.object().type_name();
    case Kind::kList:
      switch (v.list().flavor) {
        case ListFlavor::kList: return "list";
        case ListFlavor::kTuple: return "tuple";
        case ListFlavor::kDictKeys: return "dict_keys";
        case ListFlavor::kDictValues: return "dict_values";
        case ListFlavor::kDictItems: return "dict_items";
        case ListFlavor::kRange: return "range";
      }
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.as_bool();
    case Kind::kInt: return v.as_int() != 0;
    case Kind::kFloat: return v.as_float() != 0.0;
    case Kind::kString: return !v.str().empty();
    case Kind::kList: return !v.list().items.empty();
    case Kind::kDict: return !v.dict().entries.empty();
    case Kind::kObject: return !v.object().has_length() || v.object().length() != 0;
  }
  return false;
}

// Python's repr(float): the shortest round-trip digits, positional for exponents in [-4, 16).
void append_float_repr(std::string& out, double f) {
  if (std::isnan(f)) {
    out += "nan";
    return;
  }
  if (std::isinf(f)) {
    out += f < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string_view sci(buf, end - buf);
  bool negative = sci[0] == '-';
  if (negative) sci.remove_prefix(1);
  size_t e_pos = sci.find('e');
  std::string digits;
  for (char ch : sci.substr(0, e_pos)) {
    if (ch != '.') digits.push_back(ch);
  }
  int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  if (negative) out.push_back('-');
  int ndigits = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (ndigits > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (decpt <= 0) {
    out += "0.";
    out.append(-decpt, '0');
    out += digits;
  } else if (decpt >= ndigits) {
    out += digits;
    out.append(decpt - ndigits, '0');
    out += ".0";
  } else {
    out.append(digits, 0, decpt);
    out.push_back('.');
    out.append(digits, decpt);
  }
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return;
    case Kind::kString: out += v.str(); return;
    case Kind::kNone: out += "None"; return;
    case Kind::kBool: out += v.as_bool() ? "True" : "False"; return;
    case Kind::kInt: {
      char buf[24];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v.as_int());
      out.append(buf, end);
      return;
    }
    case Kind::kFloat: append_float_repr(out, v.as_float()); return;
    default: append_repr(out, v); return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v);
  return out;
}

namespace {

void append_items_repr(std::string& out, const std::vector<Value>& items) {
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += ", ";
    append_repr(out, items[k]);
  }
}

}  // namespace

void append_repr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: out += "Undefined"; return;
    case Kind::kString: pystr::append_repr(out, v.str()); return;
    case Kind::kObject: out += v.object().repr(); return;
    case Kind::kDict: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, item] : v.dict().entries) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, k);
        out += ": ";
        append_repr(out, item);
      }
      out.push_back('}');
      return;
    }
    case Kind::kList: {
      const ListData& l = v.list();
      switch (l.flavor) {
        case ListFlavor::kList:
          out.push_back('[');
          append_items_repr(out, l.items);
          out.push_back(']');
          return;
        case ListFlavor::kTuple:
          out.push_back('(');
          append_items_repr(out, l.items);
          if (l.items.size() == 1) out.push_back(',');
          out.push_back(')');
          return;
        case ListFlavor::kRange:
          out += fmt::format("range({}, {}", l.range_start, l.range_stop);
          if (l.range_step != 1) out += fmt::format(", {}", l.range_step);
          out.push_back(')');
          return;
        default:
          out += type_name(v);
          out += "([";
          append_items_repr(out, l.items);
          out += "])";
          return;
      }
    }
    default: append_str(out, v); return;
  }
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

namespace {

bool numbers_equal(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
  if (a.is_float() && b.is_float()) return a.as_float() == b.as_float();
  const Value& i = a.is_float() ? b : a;
  double f = a.is_float() ? a.as_float() : b.as_float();
  // Exact comparison of an int with a float, as Python does (no rounding of the int).
  if (!std::isfinite(f) || f != std::floor(f) || std::fabs(f) >= 9.3e18) return false;
  return static_cast<int64_t>(f) == i.as_int();
}

bool sequences_equal(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!equals(a[k], b[k])) return false;
  }
  return true;
}

bool same_members(const std::vector<Value>& a, const std::vector<Value>& b) {
  if (a.size() != b.size()) return false;
  for (const Value& x : a) {
    bool found = false;
    for (const Value& y : b) found = found || equals(x, y);
    if (!found) return false;
  }
  return true;
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return numbers_equal(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.identity() == b.identity() || a.str() == b.str();
    case Kind::kObject: return a.identity() == b.identity();
    case Kind::kDict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::kList: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (x.flavor != y.flavor) return false;
      switch (x.flavor) {
        case ListFlavor::kDictValues: return a.identity() == b.identity();
        case ListFlavor::kDictKeys:
        case ListFlavor::kDictItems: return same_members(x.items, y.items);
        default: return sequences_equal(x.items, y.items);
      }
    }
    default: return false;
  }
}

bool ordered_compare(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
  auto apply = [&](auto x, auto y) {
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    return x >= y;
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return apply(a.as_int(), b.as_int());
    return apply(a.as_float(), b.as_float());
  }
  if (a.is_string() && b.is_string()) return apply(a.str(), b.str());  // UTF-8 sorts by code point
  bool sequences = a.is_list() && b.is_list() && a.list().flavor == b.list().flavor &&
                   (a.list().flavor == ListFlavor::kList || a.list().flavor == ListFlavor::kTuple);
  if (sequences) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equals(x[k], y[k])) return ordered_compare(op, x[k], y[k]);
    }
    return apply(x.size(), y.size());
  }
  throw_error("TypeError", fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                                       type_name(a), type_name(b)));
}

bool less(const Value& a, const Value& b) { return ordered_compare("<", a, b); }

void check_hashable(const Value& v) {
  if (v.is_dict() ||
      (v.is_list() && v.list().flavor != ListFlavor::kTuple && v.list().flavor != ListFlavor::kRange)) {
    throw_error("TypeError", fmt::format("unhashable type: '{}'", type_name(v)));
  }
  if (v.is_flavor(ListFlavor::kTuple)) {
    for (const Value& item : v.list().items) check_hashable(item);
  }
}

}  // namespace m3::jinja
