// Tests, global functions and argument binding.
#include "text/jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "text/jinja/interpreter.h"
#include "text/jinja/objects.h"
#include "text/jinja/pystr.h"

namespace m3::jinja {

std::vector<Value> bind_args(std::string_view function, const CallArgs& args,
                             std::initializer_list<Param> params) {
  std::vector<Value> out(params.size());
  uint64_t given = 0;  // bit k: parameter k has a value
  if (args.positional.size() > params.size()) {
    throw_error("TypeError", fmt::format("{}() takes at most {} argument(s) ({} given)", function,
                                         params.size(), args.positional.size()));
  }
  for (size_t k = 0; k < args.positional.size(); ++k) {
    out[k] = args.positional[k];
    given |= uint64_t{1} << k;
  }
  for (const auto& [name, value] : args.keyword) {
    size_t index = 0;
    for (const Param& p : params) {
      if (p.name == name) break;
      ++index;
    }
    if (index == params.size()) {
      throw_error("TypeError", fmt::format("{}() got an unexpected keyword argument '{}'", function, name));
    }
    if (given & (uint64_t{1} << index)) {
      throw_error("TypeError", fmt::format("{}() got multiple values for argument '{}'", function, name));
    }
    out[index] = value;
    given |= uint64_t{1} << index;
  }
  size_t k = 0;
  for (const Param& p : params) {
    if (!(given & (uint64_t{1} << k))) {
      if (p.required) {
        throw_error("TypeError", fmt::format("{}() missing required argument '{}'", function, p.name));
      }
      out[k] = p.default_value;
    }
    ++k;
  }
  return out;
}

// ---- int() and float() of Python ------------------------------------------------------------

namespace {

// Python's numeric literal rules for int()/float() of a string: surrounding whitespace, a sign,
// digits with single underscores between them.
std::optional<std::string> clean_number_text(const std::string& text, bool allow_float) {
  std::string s = pystr::strip(text, std::nullopt, pystr::StripSide::kBoth);
  std::string out;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) out.push_back(s[i++]);
  bool digits = false, prev_digit = false;
  for (; i < s.size(); ++i) {
    char ch = s[i];
    if (ch >= '0' && ch <= '9') {
      out.push_back(ch);
      digits = prev_digit = true;
    } else if (ch == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else if (allow_float && (ch == '.' || ch == 'e' || ch == 'E' ||
                               ((ch == '+' || ch == '-') && (s[i - 1] == 'e' || s[i - 1] == 'E')))) {
      out.push_back(ch);
      prev_digit = false;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return out;
}

std::optional<double> parse_python_float(const std::string& text) {
  std::string s = pystr::lower(pystr::strip(text, std::nullopt, pystr::StripSide::kBoth));
  std::string body = s.empty() || (s[0] != '+' && s[0] != '-') ? s : s.substr(1);
  double sign = !s.empty() && s[0] == '-' ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") return sign * INFINITY;
  if (body == "nan") return NAN;
  auto cleaned = clean_number_text(text, true);
  if (!cleaned) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(cleaned->c_str(), &end);
  if (end != cleaned->c_str() + cleaned->size()) return std::nullopt;
  return value;
}

}  // namespace

Value python_float(const Value& v, const Value& fallback) {
  if (v.is_undefined()) v.raise_undefined();
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string()) {
    if (auto f = parse_python_float(v.str())) return Value::number(*f);
  }
  return fallback;
}

Value python_int(const Value& v, const Value& fallback, int base) {
  if (v.is_undefined()) v.raise_undefined();
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    double f = v.as_float();
    if (std::isinf(f)) throw_error("OverflowError", "cannot convert float infinity to integer");
    if (std::isnan(f)) return fallback;
    return Value::integer(static_cast<int64_t>(f));
  }
  if (v.is_string()) {
    if (base == 10) {
      if (auto cleaned = clean_number_text(v.str(), false)) {
        errno = 0;
        long long n = std::strtoll(cleaned->c_str(), nullptr, 10);
        if (errno == ERANGE) throw_error("OverflowError", "integer out of the 64-bit range");
        return Value::integer(n);
      }
    } else {
      std::string s = pystr::strip(v.str(), std::nullopt, pystr::StripSide::kBoth);
      char* end = nullptr;
      long long n = std::strtoll(s.c_str(), &end, base);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(n);
    }
    if (auto f = parse_python_float(v.str())) return python_int(Value::number(*f), fallback, 10);
  }
  return fallback;
}

// ---- tests ---------------------------------------------------------------------------------

namespace {

using Args = CallArgs;

Value one_arg(std::string_view name, Args& args) { return bind_args(name, args, {{"other", true}})[0]; }
void no_args(std::string_view name, Args& args) { bind_args(name, args, {}); }

bool t_odd(Interpreter&, const Value& v, Args& a) {
  no_args("odd", a);
  return equals(op_mod(v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interpreter&, const Value& v, Args& a) {
  no_args("even", a);
  return equals(op_mod(v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interpreter&, const Value& v, Args& a) {
  return equals(op_mod(v, bind_args("divisibleby", a, {{"num", true}})[0]), Value::integer(0));
}
bool t_defined(Interpreter&, const Value& v, Args& a) {
  no_args("defined", a);
  return !v.is_undefined();
}
bool t_undefined(Interpreter&, const Value& v, Args& a) {
  no_args("undefined", a);
  return v.is_undefined();
}
bool t_none(Interpreter&, const Value& v, Args& a) {
  no_args("none", a);
  return v.is_none();
}
bool t_boolean(Interpreter&, const Value& v, Args& a) {
  no_args("boolean", a);
  return v.is_bool();
}
bool t_false(Interpreter&, const Value& v, Args& a) {
  no_args("false", a);
  return v.is_bool() && !v.as_bool();
}
bool t_true(Interpreter&, const Value& v, Args& a) {
  no_args("true", a);
  return v.is_bool() && v.as_bool();
}
bool t_integer(Interpreter&, const Value& v, Args& a) {
  no_args("integer", a);
  return v.is_int();
}
bool t_float(Interpreter&, const Value& v, Args& a) {
  no_args("float", a);
  return v.is_float();
}
bool t_lower(Interpreter&, const Value& v, Args& a) {
  no_args("lower", a);
  return pystr::is_lower_str(to_str(v));
}
bool t_upper(Interpreter&, const Value& v, Args& a) {
  no_args("upper", a);
  return pystr::is_upper_str(to_str(v));
}
bool t_string(Interpreter&, const Value& v, Args& a) {
  no_args("string", a);
  return v.is_string();
}
bool t_mapping(Interpreter&, const Value& v, Args& a) {
  no_args("mapping", a);
  return v.is_dict();
}
bool t_number(Interpreter&, const Value& v, Args& a) {
  no_args("number", a);
  return v.is_number();
}
bool t_sequence(Interpreter&, const Value& v, Args& a) {
  no_args("sequence", a);
  // len() and __getitem__: str, list, tuple, dict, range, Undefined; not iterators or views.
  if (v.is_list()) return !v.is_flavor(ListFlavor::kDictKeys) && !v.is_flavor(ListFlavor::kDictValues) &&
                          !v.is_flavor(ListFlavor::kDictItems);
  return v.is_string() || v.is_dict() || v.is_undefined();
}
bool t_iterable(Interpreter&, const Value& v, Args& a) {
  no_args("iterable", a);
  return is_iterable(v);
}
bool t_callable(Interpreter&, const Value& v, Args& a) {
  no_args("callable", a);
  return v.is_object() && v.object().callable();
}
bool t_sameas(Interpreter&, const Value& v, Args& a) {
  Value other = one_arg("sameas", a);
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Kind::kUndefined: return v.identity() == other.identity();
    case Kind::kNone: return true;
    case Kind::kBool: return v.as_bool() == other.as_bool();
    // CPython caches the small integers, so `1 is 1` holds.
    case Kind::kInt: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Kind::kFloat: return false;
    default: return v.identity() == other.identity();
  }
}
bool t_escaped(Interpreter&, const Value&, Args& a) {
  no_args("escaped", a);
  return false;
}
bool t_in(Interpreter&, const Value& v, Args& a) { return op_contains(bind_args("in", a, {{"seq", true}})[0], v); }
bool t_eq(Interpreter&, const Value& v, Args& a) { return equals(v, one_arg("eq", a)); }
bool t_ne(Interpreter&, const Value& v, Args& a) { return !equals(v, one_arg("ne", a)); }
bool t_gt(Interpreter&, const Value& v, Args& a) { return ordered_compare(">", v, one_arg("gt", a)); }
bool t_ge(Interpreter&, const Value& v, Args& a) { return ordered_compare(">=", v, one_arg("ge", a)); }
bool t_lt(Interpreter&, const Value& v, Args& a) { return ordered_compare("<", v, one_arg("lt", a)); }
bool t_le(Interpreter&, const Value& v, Args& a) { return ordered_compare("<=", v, one_arg("le", a)); }
bool t_filter(Interpreter&, const Value& v, Args& a) {
  no_args("filter", a);
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Interpreter&, const Value& v, Args& a) {
  no_args("test", a);
  return v.is_string() && find_test(v.str()) != nullptr;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"odd", t_odd},         {"even", t_even},         {"divisibleby", t_divisibleby}, {"defined", t_defined},
    {"undefined", t_undefined}, {"filter", t_filter}, {"test", t_test},           {"none", t_none},
    {"boolean", t_boolean}, {"false", t_false},       {"true", t_true},           {"integer", t_integer},
    {"float", t_float},     {"lower", t_lower},       {"upper", t_upper},         {"string", t_string},
    {"mapping", t_mapping}, {"number", t_number},     {"sequence", t_sequence},   {"iterable", t_iterable},
    {"callable", t_callable}, {"sameas", t_sameas},   {"escaped", t_escaped},     {"in", t_in},
    {"==", t_eq},           {"eq", t_eq},             {"equalto", t_eq},          {"!=", t_ne},
    {"ne", t_ne},           {">", t_gt},              {"gt", t_gt},               {"greaterthan", t_gt},
    {"ge", t_ge},           {">=", t_ge},             {"<", t_lt},                {"lt", t_lt},
    {"lessthan", t_lt},     {"<=", t_le},             {"le", t_le},
};

}  // namespace

TestFn find_test(std::string_view name) {
  for (const TestEntry& entry : kTests) {
    if (entry.name == name) return entry.fn;
  }
  return nullptr;
}

bool is_jinja2_test(std::string_view name) { return find_test(name) != nullptr; }

bool call_test(Interpreter& interp, std::string_view name, const Value& input, CallArgs& args) {
  TestFn fn = find_test(name);
  if (fn == nullptr) throw_error("TemplateRuntimeError", fmt::format("No test named '{}'.", name));
  return fn(interp, input, args);
}

// ---- globals -------------------------------------------------------------------------------

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Interpreter&, CallArgs& args) {
  if (!args.keyword.empty()) throw_error("TypeError", "range() takes no keyword arguments");
  size_t n = args.positional.size();
  if (n < 1 || n > 3) throw_error("TypeError", fmt::format("range expected at most 3 arguments, got {}", n));
  std::vector<int64_t> v;
  for (const Value& a : args.positional) {
    if (a.is_undefined()) a.raise_undefined();
    if (!a.is_integral()) {
      throw_error("TypeError", fmt::format("'{}' object cannot be interpreted as an integer", type_name(a)));
    }
    v.push_back(a.as_int());
  }
  int64_t start = n == 1 ? 0 : v[0], stop = n == 1 ? v[0] : v[1], step = n == 3 ? v[2] : 1;
  if (step == 0) throw_error("ValueError", "range() arg 3 must not be zero");
  int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                           : (stop < start ? (start - stop - step - 1) / -step : 0);
  if (count > kMaxRange) {
    throw_error("OverflowError", fmt::format("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
                                             kMaxRange));
  }
  auto data = std::make_shared<ListData>();
  data->flavor = ListFlavor::kRange;
  data->range_start = start, data->range_stop = stop, data->range_step = step;
  for (int64_t k = 0; k < count; ++k) data->items.push_back(Value::integer(start + k * step));
  return Value::list(std::move(data));
}

// dict(mapping_or_pairs, **kwargs): also the way namespace() takes its attributes.
void fill_dict(DictData& dict, CallArgs& args, const char* function) {
  if (args.positional.size() > 1) {
    throw_error("TypeError", fmt::format("{} expected at most 1 argument, got {}", function, args.positional.size()));
  }
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [k, v] : source.dict().entries) dict.set(k, v);
    } else {
      for (const Value& pair : iterate(source)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) {
          throw_error("ValueError", fmt::format("dictionary update sequence element has length {}; 2 is required",
                                                kv.size()));
        }
        dict.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : args.keyword) dict.set(Value::string(k), v);
}

Value g_dict(Interpreter&, CallArgs& args) {
  auto dict = std::make_shared<DictData>();
  fill_dict(*dict, args, "dict");
  return Value::dict(std::move(dict));
}

Value g_namespace(Interpreter& interp, CallArgs& args) {
  auto ns = interp.new_namespace();
  fill_dict(ns->attrs, args, "namespace");
  return Value::object(ns);
}

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(std::vector<Value> items) : items_(std::move(items)) {}
  const char* type_name() const override { return "Cycler"; }
  bool get_attr(std::string_view name, Value& out) override {
    if (name == "current") {
      out = items_[pos_];
      return true;
    }
    if (name == "next" || name == "reset") {
      auto self = shared_from_this();
      std::string method(name);
      out = make_function(method, [self, method](Interpreter&, CallArgs& args) {
        bind_args(method, args, {});
        if (method == "reset") {
          self->pos_ = 0;
          return Value::none();
        }
        Value rv = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return rv;
      }, "method");
      return true;
    }
    return false;
  }
 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

Value g_cycler(Interpreter&, CallArgs& args) {
  if (args.positional.empty()) throw_error("RuntimeError", "at least one item has to be provided");
  auto cycler = std::make_shared<Cycler>(args.positional);
  return Value::object(cycler);
}

Value g_joiner(Interpreter&, CallArgs& args) {
  auto v = bind_args("joiner", args, {{"sep", false, Value::string(", ")}});
  auto used = std::make_shared<bool>(false);
  Value sep = v[0];
  return make_function("joiner", [used, sep](Interpreter&, CallArgs& call_args) {
    bind_args("joiner", call_args, {});
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return sep;
  }, "Joiner");
}

Value g_raise_exception(Interpreter&, CallArgs& args) {
  auto v = bind_args("raise_exception", args, {{"message", true}});
  throw_error("TemplateError", to_str(v[0]));
}

Value g_strftime_now(Interpreter& interp, CallArgs& args) {
  auto v = bind_args("strftime_now", args, {{"format", true}});
  if (!v[0].is_string()) {
    throw_error("TypeError", fmt::format("strftime() argument 1 must be str, not {}", type_name(v[0])));
  }
  std::time_t now = interp.options().now ? *interp.options().now : std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  // %f (microseconds) is Python's own addition to strftime.
  std::string format = pystr::replace(v[0].str(), "%f", "000000", -1);
  if (format.empty()) return Value::string("");
  std::string out(256 + format.size() * 8, '\0');
  size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
  out.resize(n);
  return Value::string(std::move(out));
}

}  // namespace

void add_globals(Scope& scope) {
  scope.set("range", make_function("range", g_range, "type"));
  scope.set("dict", make_function("dict", g_dict, "type"));
  scope.set("namespace", make_function("namespace", g_namespace, "type"));
  scope.set("cycler", make_function("cycler", g_cycler, "type"));
  scope.set("joiner", make_function("joiner", g_joiner, "type"));
  scope.set("raise_exception", make_function("raise_exception", g_raise_exception, "function"));
  scope.set("strftime_now", make_function("strftime_now", g_strftime_now, "function"));
}

}  // namespace m3::jinja
