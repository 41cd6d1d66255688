// jinja2's built-in filters with their Python semantics (generators where jinja2 returns
// generators), and transformers' tojson.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/methods.h"
#include "text/jinja/objects.h"
#include "text/jinja/pyjson.h"
#include "text/jinja/pystr.h"

namespace m3::jinja {

namespace {

using Args = CallArgs;
const Value kNone = Value::none();

std::string soft_str(const Value& v) { return to_str(v); }

int64_t int_arg(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw_error("TypeError", fmt::format("'{}' object cannot be interpreted as an integer ({})", type_name(v), what));
  }
  return v.as_int();
}

// jinja2's make_attrgetter: "a.b.0" looks up item by item (integers for digit parts).
std::vector<Value> attribute_parts(const Value& attribute) {
  if (attribute.is_none() || attribute.is_undefined()) return {};
  if (!attribute.is_string()) return {attribute};
  std::vector<Value> parts;
  for (std::string& part : pystr::split(attribute.str(), std::string("."), -1)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(std::move(part)));
  }
  return parts;
}

Value lookup_path(Value item, const std::vector<Value>& parts, const Value& default_value) {
  for (const Value& part : parts) {
    item = get_item(item, part);
    if (!default_value.is_none() && !default_value.is_undefined() && item.is_undefined()) item = default_value;
  }
  return item;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(pystr::lower(v.str())) : v; }

// Python's key comparison for sorted(): lists of keys compare element by element.
bool keys_less(const std::vector<Value>& a, const std::vector<Value>& b) {
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    if (!equals(a[k], b[k])) return less(a[k], b[k]);
  }
  return a.size() < b.size();
}

std::vector<Value> sorted_by(std::vector<Value> items, const std::function<std::vector<Value>(const Value&)>& key,
                             bool reverse) {
  std::vector<std::pair<std::vector<Value>, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? keys_less(b.first, a.first) : keys_less(a.first, b.first);
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return out;
}

Value f_abs(Interpreter&, const Value& in, Args& args) {
  bind_args("abs", args, {});
  if (in.is_integral()) {
    if (in.as_int() == INT64_MIN) throw_error("OverflowError", "integer overflow");
    return Value::integer(std::llabs(in.as_int()));
  }
  if (in.is_float()) return Value::number(std::fabs(in.as_float()));
  if (in.is_undefined()) in.raise_undefined();
  throw_error("TypeError", fmt::format("bad operand type for abs(): '{}'", type_name(in)));
}

Value f_attr(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("attr", args, {{"name", true}});
  if (in.is_undefined()) in.raise_undefined();
  std::string name = soft_str(v[0]);
  Value out;
  if (!name.empty() && name[0] == '_') return get_attr(in, name);
  if (in.is_object() ? in.object().get_attr(name, out) : lookup_method(in, name, out)) return out;
  return Value::missing_attribute(type_name(in), name);
}

Value f_batch(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("batch", args, {{"linecount", true}, {"fill_with", false, kNone}});
  int64_t count = int_arg(v[0], "linecount");
  std::vector<Value> batches, current;
  for (Value& item : iterate(in)) {
    if (static_cast<int64_t>(current.size()) == count) {
      batches.push_back(Value::list(std::move(current)));
      current.clear();
    }
    current.push_back(std::move(item));
  }
  if (!current.empty()) {
    if (!v[1].is_none()) {
      while (static_cast<int64_t>(current.size()) < count) current.push_back(v[1]);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return make_iterator(std::move(batches));
}

Value f_capitalize(Interpreter&, const Value& in, Args& args) {
  bind_args("capitalize", args, {});
  return Value::string(pystr::capitalize(soft_str(in)));
}

Value f_center(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("center", args, {{"width", false, Value::integer(80)}});
  return Value::string(pystr::pad(soft_str(in), int_arg(v[0], "width"), U' ', '^'));
}

Value f_length(Interpreter&, const Value& in, Args& args) {
  bind_args("length", args, {});
  return Value::integer(length(in));
}

Value f_default(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("default", args, {{"default_value", false, Value::string("")}, {"boolean", false, Value::boolean(false)}});
  if (in.is_undefined() || (truthy(v[1]) && !truthy(in))) return v[0];
  return in;
}

Value f_dictsort(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("dictsort", args, {{"case_sensitive", false, Value::boolean(false)},
                                        {"by", false, Value::string("key")},
                                        {"reverse", false, Value::boolean(false)}});
  if (!in.is_dict()) throw_error("AttributeError", fmt::format("'{}' object has no attribute 'items'", type_name(in)));
  size_t pos;
  if (v[1].is_string() && v[1].str() == "key") {
    pos = 0;
  } else if (v[1].is_string() && v[1].str() == "value") {
    pos = 1;
  } else {
    throw_error("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  }
  std::vector<Value> items;
  for (const auto& [k, item] : in.dict().entries) items.push_back(make_tuple({k, item}));
  bool case_sensitive = truthy(v[0]);
  return Value::list(sorted_by(std::move(items), [&](const Value& pair) {
    const Value& x = pair.list().items[pos];
    return std::vector<Value>{case_sensitive ? x : ignore_case(x)};
  }, truthy(v[2])));
}

Value f_escape(Interpreter&, const Value& in, Args& args) {
  bind_args("escape", args, {});
  std::string out;
  for (char ch : soft_str(in)) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(ch);
    }
  }
  return Value::string(std::move(out));
}

Value f_first(Interpreter&, const Value& in, Args& args) {
  bind_args("first", args, {});
  std::vector<Value> items = iterate(in);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& in, Args& args) {
  bind_args("last", args, {});
  if (in.is_object()) throw_error("TypeError", fmt::format("'{}' object is not reversible", type_name(in)));
  std::vector<Value> items = iterate(in);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("float", args, {{"default", false, Value::number(0.0)}});
  return python_float(in, v[0]);
}

Value f_int(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("int", args, {{"default", false, Value::integer(0)}, {"base", false, Value::integer(10)}});
  return python_int(in, v[0], static_cast<int>(int_arg(v[1], "base")));
}

Value f_format(Interpreter&, const Value& in, Args& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    throw_error("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
  }
  if (!args.keyword.empty()) {
    auto dict = std::make_shared<DictData>();
    for (auto& [k, val] : args.keyword) dict->entries.emplace_back(Value::string(k), val);
    return Value::string(percent_format(soft_str(in), Value::dict(std::move(dict))));
  }
  return Value::string(percent_format(soft_str(in), make_tuple(args.positional)));
}

Value f_indent(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("indent", args, {{"width", false, Value::integer(4)}, {"first", false, Value::boolean(false)},
                                      {"blank", false, Value::boolean(false)}});
  if (!in.is_string()) throw_error("TypeError", fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(in)));
  std::string indention = v[0].is_string() ? v[0].str() : std::string(std::max<int64_t>(0, int_arg(v[0], "width")), ' ');
  std::vector<std::string> lines = pystr::splitlines(in.str() + "\n", false);
  std::string rv;
  bool indent_blank_lines = truthy(v[2]);
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) {
      rv.push_back('\n');
      if (indent_blank_lines || !lines[k].empty()) rv.append(indention);
    }
    rv.append(lines[k]);
  }
  if (truthy(v[1])) rv = indention + rv;
  return Value::string(std::move(rv));
}

Value f_items(Interpreter&, const Value& in, Args& args) {
  bind_args("items", args, {});
  if (in.is_undefined()) return make_iterator({});
  if (!in.is_dict()) throw_error("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& [k, v] : in.dict().entries) items.push_back(make_tuple({k, v}));
  return make_iterator(std::move(items));
}

Value f_join(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("join", args, {{"d", false, Value::string("")}, {"attribute", false, kNone}});
  std::vector<Value> parts = attribute_parts(v[1]);
  std::string sep = soft_str(v[0]), out;
  bool first = true;
  for (const Value& item : iterate(in)) {
    if (!first) out += sep;
    first = false;
    append_str(out, v[1].is_none() ? item : lookup_path(item, parts, kNone));
  }
  return Value::string(std::move(out));
}

Value f_list(Interpreter&, const Value& in, Args& args) {
  bind_args("list", args, {});
  return Value::list(iterate(in));
}

Value f_lower(Interpreter&, const Value& in, Args& args) {
  bind_args("lower", args, {});
  return Value::string(pystr::lower(soft_str(in)));
}

Value f_upper(Interpreter&, const Value& in, Args& args) {
  bind_args("upper", args, {});
  return Value::string(pystr::upper(soft_str(in)));
}

Value f_map(Interpreter& interp, const Value& in, Args& args) {
  if (!truthy(in)) return make_iterator({});
  std::vector<Value> out;
  bool by_attribute = args.positional.empty();
  for (auto& [k, val] : args.keyword) by_attribute = by_attribute && (k == "attribute" || k == "default");
  if (args.positional.empty() && args.keyword.empty()) throw_error("FilterArgumentError", "map requires a filter argument");
  if (by_attribute) {
    auto v = bind_args("map", args, {{"attribute", true}, {"default", false, kNone}});
    std::vector<Value> parts = attribute_parts(v[0]);
    for (const Value& item : iterate(in)) out.push_back(lookup_path(item, parts, v[1]));
  } else {
    if (args.positional.empty()) {
      throw_error("FilterArgumentError", fmt::format("Unexpected keyword argument '{}'", args.keyword.front().first));
    }
    std::string name = soft_str(args.positional.front());
    CallArgs rest{std::vector<Value>(args.positional.begin() + 1, args.positional.end()), args.keyword};
    for (const Value& item : iterate(in)) {
      CallArgs call_args = rest;
      out.push_back(call_filter(interp, name, item, call_args));
    }
  }
  return make_iterator(std::move(out));
}

Value min_or_max(const Value& in, Args& args, bool is_max) {
  auto v = bind_args(is_max ? "max" : "min", args, {{"case_sensitive", false, Value::boolean(false)},
                                                    {"attribute", false, kNone}});
  std::vector<Value> items = iterate(in);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  std::vector<Value> parts = attribute_parts(v[1]);
  auto key = [&](const Value& item) {
    Value k = lookup_path(item, parts, kNone);
    return truthy(v[0]) ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value candidate = key(items[k]);
    if (is_max ? less(best_key, candidate) : less(candidate, best_key)) best = k, best_key = candidate;
  }
  return items[best];
}

Value f_max(Interpreter&, const Value& in, Args& args) { return min_or_max(in, args, true); }
Value f_min(Interpreter&, const Value& in, Args& args) { return min_or_max(in, args, false); }

// select/reject/selectattr/rejectattr.
Value select_or_reject(Interpreter& interp, const Value& in, Args& args, bool keep_when, bool by_attribute) {
  if (!truthy(in)) return make_iterator({});
  size_t offset = 0;
  std::vector<Value> parts;
  if (by_attribute) {
    if (args.positional.empty()) throw_error("FilterArgumentError", "Missing parameter for attribute name");
    parts = attribute_parts(args.positional[0]);
    offset = 1;
  }
  bool has_test = args.positional.size() > offset;
  std::string test_name = has_test ? soft_str(args.positional[offset]) : "";
  CallArgs test_args{has_test ? std::vector<Value>(args.positional.begin() + offset + 1, args.positional.end())
                              : std::vector<Value>{},
                     args.keyword};
  std::vector<Value> out;
  for (const Value& item : iterate(in)) {
    Value subject = by_attribute ? lookup_path(item, parts, kNone) : item;
    bool result;
    if (has_test) {
      CallArgs call_args = test_args;
      result = call_test(interp, test_name, subject, call_args);
    } else {
      result = truthy(subject);
    }
    if (result == keep_when) out.push_back(item);
  }
  return make_iterator(std::move(out));
}

Value f_select(Interpreter& i, const Value& in, Args& a) { return select_or_reject(i, in, a, true, false); }
Value f_reject(Interpreter& i, const Value& in, Args& a) { return select_or_reject(i, in, a, false, false); }
Value f_selectattr(Interpreter& i, const Value& in, Args& a) { return select_or_reject(i, in, a, true, true); }
Value f_rejectattr(Interpreter& i, const Value& in, Args& a) { return select_or_reject(i, in, a, false, true); }

Value f_replace(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("replace", args, {{"old", true}, {"new", true}, {"count", false, kNone}});
  int64_t count = v[2].is_none() ? -1 : int_arg(v[2], "count");
  return Value::string(pystr::replace(soft_str(in), soft_str(v[0]), soft_str(v[1]), count));
}

Value f_reverse(Interpreter&, const Value& in, Args& args) {
  bind_args("reverse", args, {});
  if (in.is_string()) {
    std::u32string chars = pystr::decode(in.str());
    std::reverse(chars.begin(), chars.end());
    return Value::string(pystr::encode(chars));
  }
  std::vector<Value> items = iterate(in);
  std::reverse(items.begin(), items.end());
  if (in.is_object()) return Value::list(std::move(items));  // reversed() fails; jinja2 builds a list
  const char* type = in.is_dict() ? "dict_reversekeyiterator"
                     : in.is_flavor(ListFlavor::kTuple) || in.is_flavor(ListFlavor::kRange) ? "reversed"
                                                                                          : "list_reverseiterator";
  return make_iterator(std::move(items), type);
}

Value f_round(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("round", args, {{"precision", false, Value::integer(0)}, {"method", false, Value::string("common")}});
  std::string method = soft_str(v[1]);
  if (method != "common" && method != "ceil" && method != "floor") {
    throw_error("FilterArgumentError", "method must be common, ceil or floor");
  }
  int64_t precision = int_arg(v[0], "precision");
  if (in.is_undefined()) in.raise_undefined();
  if (!in.is_number()) throw_error("TypeError", fmt::format("type {} doesn't define __round__ method", type_name(in)));
  if (method == "common") {
    if (in.is_integral()) return Value::integer(in.as_int());  // round(int, n) keeps the int for n >= 0
    double x = in.as_float();
    if (!std::isfinite(x)) return in;
    if (precision >= 0) {
      // printf rounds the exact binary value correctly (ties to even), as Python's round() does.
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
      return Value::number(std::strtod(buf, nullptr));
    }
    double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value::number(std::nearbyint(x / scale) * scale);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = in.as_float() * scale;
  return Value::number((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Value f_safe(Interpreter&, const Value& in, Args& args) {
  bind_args("safe", args, {});
  return Value::string(soft_str(in));
}

Value f_slice(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("slice", args, {{"slices", true}, {"fill_with", false, kNone}});
  std::vector<Value> seq = iterate(in);
  int64_t slices = int_arg(v[0], "slices");
  if (slices == 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
  int64_t n = static_cast<int64_t>(seq.size());
  int64_t per = n / slices, extra = n % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    int64_t start = offset + k * per;
    if (k < extra) ++offset;
    int64_t end = offset + (k + 1) * per;
    std::vector<Value> part(seq.begin() + std::clamp<int64_t>(start, 0, n), seq.begin() + std::clamp<int64_t>(end, 0, n));
    if (!v[1].is_none() && k >= extra) part.push_back(v[1]);
    out.push_back(Value::list(std::move(part)));
  }
  return make_iterator(std::move(out));
}

Value f_sort(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("sort", args, {{"reverse", false, Value::boolean(false)}, {"case_sensitive", false, Value::boolean(false)},
                                    {"attribute", false, kNone}});
  bool case_sensitive = truthy(v[1]);
  // make_multi_attrgetter: "a,b" sorts by several attributes.
  std::vector<std::vector<Value>> paths;
  if (v[2].is_string()) {
    for (const std::string& a : pystr::split(v[2].str(), std::string(","), -1)) paths.push_back(attribute_parts(Value::string(a)));
  } else {
    paths.push_back(attribute_parts(v[2]));
  }
  return Value::list(sorted_by(iterate(in), [&](const Value& item) {
    std::vector<Value> keys;
    for (const auto& path : paths) {
      Value k = lookup_path(item, path, kNone);
      keys.push_back(case_sensitive ? k : ignore_case(k));
    }
    return keys;
  }, truthy(v[0])));
}

Value f_string(Interpreter&, const Value& in, Args& args) {
  bind_args("string", args, {});
  return in.is_string() ? in : Value::string(soft_str(in));
}

Value f_sum(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("sum", args, {{"attribute", false, kNone}, {"start", false, Value::integer(0)}});
  std::vector<Value> parts = attribute_parts(v[0]);
  Value total = v[1];
  for (const Value& item : iterate(in)) {
    total = op_add(total, v[0].is_none() ? item : lookup_path(item, parts, kNone));
  }
  return total;
}

Value f_title(Interpreter&, const Value& in, Args& args) {
  bind_args("title", args, {});
  // jinja2 splits at runs of "-", whitespace and opening brackets, then upper()s the first
  // character of each piece and lower()s the rest.
  std::u32string s = pystr::decode(soft_str(in)), out;
  auto is_boundary = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(c);
  };
  bool at_start = true;
  for (char32_t c : s) {
    if (is_boundary(c)) {
      out.push_back(c);
      at_start = true;
      continue;
    }
    std::string ch;
    pystr::append_utf8(ch, c);
    std::u32string mapped = pystr::decode(at_start ? pystr::upper(ch) : pystr::lower(ch));
    out += mapped;
    at_start = false;
  }
  return Value::string(pystr::encode(out));
}

Value f_tojson(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("tojson", args, {{"ensure_ascii", false, Value::boolean(false)}, {"indent", false, kNone},
                                      {"separators", false, kNone}, {"sort_keys", false, Value::boolean(false)}});
  JsonDumpOptions options;
  options.ensure_ascii = truthy(v[0]);
  if (v[1].is_string()) {
    options.indent = v[1].str();
  } else if (v[1].is_integral()) {
    options.indent = std::string(std::max<int64_t>(0, v[1].as_int()), ' ');
  } else if (!v[1].is_none()) {
    throw_error("TypeError", fmt::format("indent must be an int or a str, not {}", type_name(v[1])));
  }
  if (!v[2].is_none()) {
    std::vector<Value> seps = iterate(v[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      throw_error("ValueError", "separators must be a pair of strings");
    }
    options.item_separator = seps[0].str();
    options.key_separator = seps[1].str();
  }
  options.sort_keys = truthy(v[3]);
  return Value::string(json_dumps(in, options));
}

Value f_trim(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("trim", args, {{"chars", false, kNone}});
  std::optional<std::string> chars;
  if (!v[0].is_none()) chars = soft_str(v[0]);
  return Value::string(pystr::strip(soft_str(in), chars, pystr::StripSide::kBoth));
}

Value f_truncate(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("truncate", args, {{"length", false, Value::integer(255)}, {"killwords", false, Value::boolean(false)},
                                        {"end", false, Value::string("...")}, {"leeway", false, kNone}});
  int64_t length = int_arg(v[0], "length");
  int64_t leeway = v[3].is_none() ? 5 : int_arg(v[3], "leeway");
  std::string end = soft_str(v[2]);
  int64_t end_length = static_cast<int64_t>(pystr::length(end));
  if (length < end_length) throw_error("AssertionError", fmt::format("expected length >= {}, got {}", end_length, length));
  if (leeway < 0) throw_error("AssertionError", fmt::format("expected leeway >= 0, got {}", leeway));
  // jinja2 measures and returns the value itself; only strings get cut.
  if (jinja::length(in) <= length + leeway) return in;
  if (!in.is_string()) {
    throw_error("TypeError", fmt::format("can only concatenate {} (not \"str\") to {}", type_name(in), type_name(in)));
  }
  std::u32string s = pystr::decode(in.str());
  std::u32string head = s.substr(0, length - end_length);
  if (!truthy(v[1])) {
    size_t space = head.rfind(U' ');
    if (space != std::u32string::npos) head.resize(space);
  }
  return Value::string(pystr::encode(head) + end);
}

Value f_unique(Interpreter&, const Value& in, Args& args) {
  auto v = bind_args("unique", args, {{"case_sensitive", false, Value::boolean(false)}, {"attribute", false, kNone}});
  std::vector<Value> parts = attribute_parts(v[1]);
  std::vector<Value> seen, out;
  for (const Value& item : iterate(in)) {
    Value key = lookup_path(item, parts, kNone);
    if (!truthy(v[0])) key = ignore_case(key);
    check_hashable(key);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return make_iterator(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& in, Args& args) {
  bind_args("wordcount", args, {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : pystr::decode(soft_str(in))) {
    bool word = pystr::is_word(c);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::integer(words);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},         {"capitalize", f_capitalize},
    {"center", f_center},     {"count", f_length},      {"d", f_default},           {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},       {"first", f_first},
    {"float", f_float},       {"forceescape", f_escape}, {"format", f_format},      {"indent", f_indent},
    {"int", f_int},           {"items", f_items},       {"join", f_join},           {"last", f_last},
    {"length", f_length},     {"list", f_list},         {"lower", f_lower},         {"map", f_map},
    {"max", f_max},           {"min", f_min},           {"reject", f_reject},       {"rejectattr", f_rejectattr},
    {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},         {"safe", f_safe},
    {"select", f_select},     {"selectattr", f_selectattr}, {"slice", f_slice},     {"sort", f_sort},
    {"string", f_string},     {"sum", f_sum},           {"title", f_title},         {"tojson", f_tojson},
    {"trim", f_trim},         {"truncate", f_truncate}, {"unique", f_unique},       {"upper", f_upper},
    {"wordcount", f_wordcount},
};

// jinja2 filters m3serve leaves out (no chat template needs them): they fail when used.
constexpr std::string_view kUnsupportedFilters[] = {"filesizeformat", "groupby", "pprint", "random", "striptags",
                                                    "urlencode", "urlize", "wordwrap", "xmlattr"};

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const FilterEntry& entry : kFilters) {
    if (entry.name == name) return entry.fn;
  }
  return nullptr;
}

bool is_jinja2_filter(std::string_view name) {
  return find_filter(name) != nullptr ||
         std::find(std::begin(kUnsupportedFilters), std::end(kUnsupportedFilters), name) != std::end(kUnsupportedFilters);
}

Value call_filter(Interpreter& interp, std::string_view name, const Value& input, CallArgs& args) {
  FilterFn fn = find_filter(name);
  if (fn == nullptr) {
    throw_error("TemplateRuntimeError", is_jinja2_filter(name)
                                            ? fmt::format("the '{}' filter is not supported by m3serve's chat template interpreter", name)
                                            : fmt::format("No filter named '{}'.", name));
  }
  return fn(interp, input, args);
}

}  // namespace m3::jinja
