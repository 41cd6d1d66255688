#include "text/jinja/methods.h"

#include <fmt/format.h>

#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/objects.h"
#include "text/jinja/pystr.h"

namespace m3::jinja {
namespace {

// Methods the ImmutableSandboxedEnvironment refuses (they modify a list or dict in place).
bool is_blocked_mutator(const Value& self, std::string_view name) {
  if (self.is_flavor(ListFlavor::kList)) {
    return name == "append" || name == "reverse" || name == "insert" || name == "sort" ||
           name == "extend" || name == "remove";
  }
  if (self.is_dict()) {
    return name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" ||
           name == "update";
  }
  return false;
}

std::optional<std::string> optional_str(const Value& v, std::string_view function) {
  if (v.is_none()) return std::nullopt;
  if (!v.is_string()) {
    throw_error("TypeError", fmt::format("{} arg must be None or str", function));
  }
  return v.str();
}

const std::string& require_str(const Value& v, std::string_view what) {
  if (!v.is_string()) {
    throw_error("TypeError", fmt::format("{} must be str, not {}", what, type_name(v)));
  }
  return v.str();
}

int64_t require_int(const Value& v, std::string_view what) {
  if (!v.is_integral()) {
    throw_error("TypeError", fmt::format("'{}' object cannot be interpreted as an integer ({})",
                                         type_name(v), what));
  }
  return v.as_int();
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

int64_t index_or_default(const Value& v, int64_t fallback) {
  return v.is_none() ? fallback : require_int(v, "slice index");
}

// str.startswith / str.endswith with a str or a tuple of str and optional [start, end).
bool affix_match(const std::string& self, const Value& affix, const Value& start, const Value& end,
                 bool prefix) {
  std::string text = self;
  if (!start.is_none() || !end.is_none()) {
    text = get_slice(Value::string(self), start, end, Value::none()).str();
  }
  auto one = [&](const Value& a) {
    const std::string& s = require_str(a, prefix ? "startswith first arg" : "endswith first arg");
    if (s.size() > text.size()) return false;
    return prefix ? text.compare(0, s.size(), s) == 0
                  : text.compare(text.size() - s.size(), s.size(), s) == 0;
  };
  if (affix.is_flavor(ListFlavor::kTuple)) {
    return std::any_of(affix.list().items.begin(), affix.list().items.end(), one);
  }
  return one(affix);
}

Value call_str_method(const std::string& s, std::string_view name, CallArgs& args) {
  auto none = Value::none();
  std::string fn = fmt::format("str.{}", name);
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto v = bind_args(fn, args, {{"chars", false, none}});
    auto side = name == "strip"    ? pystr::StripSide::kBoth
                : name == "lstrip" ? pystr::StripSide::kLeft
                                   : pystr::StripSide::kRight;
    return Value::string(pystr::strip(s, optional_str(v[0], name), side));
  }
  if (name == "split" || name == "rsplit") {
    auto v = bind_args(fn, args, {{"sep", false, none}, {"maxsplit", false, Value::integer(-1)}});
    auto sep = optional_str(v[0], "sep");
    if (sep && sep->empty()) throw_error("ValueError", "empty separator");
    int64_t maxsplit = require_int(v[1], "maxsplit");
    return string_list(name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    auto v = bind_args(fn, args, {{"keepends", false, Value::boolean(false)}});
    return string_list(pystr::splitlines(s, truthy(v[0])));
  }
  if (name == "startswith" || name == "endswith") {
    auto v = bind_args(fn, args, {{"affix", true}, {"start", false, none}, {"end", false, none}});
    return Value::boolean(affix_match(s, v[0], v[1], v[2], name == "startswith"));
  }
  if (name == "replace") {
    auto v = bind_args(fn, args, {{"old", true}, {"new", true}, {"count", false, Value::integer(-1)}});
    return Value::string(pystr::replace(s, require_str(v[0], "replace() argument 1"),
                                        require_str(v[1], "replace() argument 2"), require_int(v[2], "count")));
  }
  if (name == "upper") {
    bind_args(fn, args, {});
    return Value::string(pystr::upper(s));
  }
  if (name == "lower" || name == "casefold") {
    bind_args(fn, args, {});
    return Value::string(pystr::lower(s));
  }
  if (name == "title") {
    bind_args(fn, args, {});
    return Value::string(pystr::title(s));
  }
  if (name == "capitalize") {
    bind_args(fn, args, {});
    return Value::string(pystr::capitalize(s));
  }
  if (name == "swapcase") {
    bind_args(fn, args, {});
    return Value::string(pystr::swapcase(s));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    auto v = bind_args(fn, args, {{"sub", true}, {"start", false, none}, {"end", false, none}});
    const std::string& sub = require_str(v[0], "must be str");
    int64_t start = index_or_default(v[1], 0), end = index_or_default(v[2], INT64_MAX);
    if (name == "count") return Value::integer(pystr::count(s, sub, start, end));
    bool reverse = name[0] == 'r';
    int64_t pos = pystr::find(s, sub, start, end, reverse);
    if (pos < 0 && (name == "index" || name == "rindex")) throw_error("ValueError", "substring not found");
    return Value::integer(pos);
  }
  if (name == "join") {
    auto v = bind_args(fn, args, {{"iterable", true}});
    std::string out;
    size_t k = 0;
    for (const Value& item : iterate(v[0])) {
      if (!item.is_string()) {
        throw_error("TypeError", fmt::format("sequence item {}: expected str instance, {} found", k,
                                             type_name(item)));
      }
      if (k++) out += s;
      out += item.str();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(brace_format(s, args));
  if (name == "isdigit" || name == "isdecimal") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::all_match(s, pystr::is_decimal));
  }
  if (name == "isnumeric") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::all_match(s, pystr::is_numeric));
  }
  if (name == "isalpha") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::all_match(s, pystr::is_alpha));
  }
  if (name == "isalnum") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::all_match(s, pystr::is_alnum));
  }
  if (name == "isspace") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::all_match(s, pystr::is_space));
  }
  if (name == "isupper") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::is_upper_str(s));
  }
  if (name == "islower") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::is_lower_str(s));
  }
  if (name == "isascii") {
    bind_args(fn, args, {});
    return Value::boolean(pystr::is_ascii(s));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    auto v = bind_args(fn, args, {{"width", true}, {"fillchar", false, Value::string(" ")}});
    const std::string& fill = require_str(v[1], "fill character");
    std::u32string fill_chars = pystr::decode(fill);
    if (fill_chars.size() != 1) {
      throw_error("TypeError", "The fill character must be exactly one character long");
    }
    char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
    return Value::string(pystr::pad(s, require_int(v[0], "width"), fill_chars[0], align));
  }
  if (name == "zfill") {
    auto v = bind_args(fn, args, {{"width", true}});
    int64_t width = require_int(v[0], "width");
    int64_t n = static_cast<int64_t>(pystr::length(s));
    if (width <= n) return Value::string(s);
    size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    return Value::string(s.substr(0, sign) + std::string(width - n, '0') + s.substr(sign));
  }
  if (name == "partition" || name == "rpartition") {
    auto v = bind_args(fn, args, {{"sep", true}});
    const std::string& sep = require_str(v[0], "sep");
    if (sep.empty()) throw_error("ValueError", "empty separator");
    size_t pos = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (pos == std::string::npos) {
      std::vector<Value> parts = {Value::string(""), Value::string(""), Value::string("")};
      parts[name == "partition" ? 0 : 2] = Value::string(s);
      return make_tuple(std::move(parts));
    }
    return make_tuple({Value::string(s.substr(0, pos)), Value::string(sep),
                       Value::string(s.substr(pos + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto v = bind_args(fn, args, {{"affix", true}});
    const std::string& affix = require_str(v[0], "argument");
    bool prefix = name == "removeprefix";
    bool matches = affix.size() <= s.size() &&
                   (prefix ? s.compare(0, affix.size(), affix) == 0
                           : s.compare(s.size() - affix.size(), affix.size(), affix) == 0);
    if (!matches) return Value::string(s);
    return Value::string(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
  }
  throw_error("TemplateRuntimeError", fmt::format("str.{}() is not supported by m3serve's chat "
                                                  "template interpreter", name));
}

Value dict_view(const DictData& dict, ListFlavor flavor) {
  std::vector<Value> items;
  items.reserve(dict.entries.size());
  for (const auto& [k, v] : dict.entries) {
    if (flavor == ListFlavor::kDictKeys) {
      items.push_back(k);
    } else if (flavor == ListFlavor::kDictValues) {
      items.push_back(v);
    } else {
      items.push_back(make_tuple({k, v}));
    }
  }
  return Value::list(std::move(items), flavor);
}

Value call_dict_method(const Value& self, std::string_view name, CallArgs& args) {
  std::string fn = fmt::format("dict.{}", name);
  const DictData& dict = self.dict();
  if (name == "items") {
    bind_args(fn, args, {});
    return dict_view(dict, ListFlavor::kDictItems);
  }
  if (name == "keys") {
    bind_args(fn, args, {});
    return dict_view(dict, ListFlavor::kDictKeys);
  }
  if (name == "values") {
    bind_args(fn, args, {});
    return dict_view(dict, ListFlavor::kDictValues);
  }
  if (name == "get") {
    auto v = bind_args(fn, args, {{"key", true}, {"default", false, Value::none()}});
    const Value* found = dict.find(v[0]);
    return found ? *found : v[1];
  }
  if (name == "copy") {
    bind_args(fn, args, {});
    return Value::dict(std::make_shared<DictData>(dict));
  }
  throw_error("TemplateRuntimeError", fmt::format("dict.{}() is not supported by m3serve's chat "
                                                  "template interpreter", name));
}

Value call_list_method(const Value& self, std::string_view name, CallArgs& args) {
  std::string fn = fmt::format("{}.{}", type_name(self), name);
  ListData& list = self.list();
  if (name == "count") {
    auto v = bind_args(fn, args, {{"value", true}});
    return Value::integer(std::count_if(list.items.begin(), list.items.end(),
                                        [&](const Value& x) { return equals(x, v[0]); }));
  }
  if (name == "index") {
    auto v = bind_args(fn, args, {{"value", true}});
    for (size_t k = 0; k < list.items.size(); ++k) {
      if (equals(list.items[k], v[0])) return Value::integer(static_cast<int64_t>(k));
    }
    throw_error("ValueError", fmt::format("{} is not in list", repr(v[0])));
  }
  if (name == "copy") {
    bind_args(fn, args, {});
    return Value::list(list.items);
  }
  if (name == "clear") {
    bind_args(fn, args, {});
    list.items.clear();
    return Value::none();
  }
  if (name == "pop") {
    auto v = bind_args(fn, args, {{"index", false, Value::integer(-1)}});
    if (list.items.empty()) throw_error("IndexError", "pop from empty list");
    int64_t index = require_int(v[0], "index");
    int64_t size = static_cast<int64_t>(list.items.size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) throw_error("IndexError", "pop index out of range");
    Value item = list.items[index];
    list.items.erase(list.items.begin() + index);
    return item;
  }
  throw_error("TemplateRuntimeError", fmt::format("{}() is not supported by m3serve's chat template "
                                                  "interpreter", fn));
}

constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold",   "center",     "count",        "encode",    "endswith",  "expandtabs",
    "find",       "format",     "format_map", "index",        "isalnum",   "isalpha",   "isascii",
    "isdecimal",  "isdigit",    "isidentifier", "islower",    "isnumeric", "isprintable", "isspace",
    "istitle",    "isupper",    "join",       "ljust",        "lower",     "lstrip",    "maketrans",
    "partition",  "removeprefix", "removesuffix", "replace",  "rfind",     "rindex",    "rjust",
    "rpartition", "rsplit",     "rstrip",     "split",        "splitlines", "startswith", "strip",
    "swapcase",   "title",      "translate",  "upper",        "zfill"};
constexpr std::string_view kDictMethods[] = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                             "pop", "popitem", "setdefault", "update", "values"};
constexpr std::string_view kListMethods[] = {"append", "clear", "copy", "count", "extend", "index",
                                             "insert", "pop", "remove", "reverse", "sort"};
constexpr std::string_view kTupleMethods[] = {"count", "index"};

// Attribute lookups on dicts check the method names first (d.items is the method even when
// the dict has an "items" key), so most lookups end in a miss here: reject by first letter.
template <size_t N>
bool contains(const std::string_view (&names)[N], std::string_view name) {
  if (name.empty()) return false;
  bool first_letter_seen = false;
  for (std::string_view candidate : names) first_letter_seen = first_letter_seen || candidate[0] == name[0];
  if (!first_letter_seen) return false;
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

}  // namespace

bool lookup_method(const Value& self, std::string_view name, Value& out) {
  bool known = false;
  if (self.is_string()) {
    known = contains(kStrMethods, name);
  } else if (self.is_dict()) {
    known = contains(kDictMethods, name);
  } else if (self.is_flavor(ListFlavor::kList)) {
    known = contains(kListMethods, name);
  } else if (self.is_flavor(ListFlavor::kTuple)) {
    known = contains(kTupleMethods, name);
  }
  if (!known) return false;
  if (is_blocked_mutator(self, name)) {
    out = Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name,
                                       type_name(self)),
                           /*unsafe=*/true);
    return true;
  }
  std::string method(name);
  out = make_function(method, [self, method](Interpreter&, CallArgs& args) {
    if (self.is_string()) return call_str_method(self.str(), method, args);
    if (self.is_dict()) return call_dict_method(self, method, args);
    return call_list_method(self, method, args);
  });
  return true;
}

}  // namespace m3::jinja
