// The filters, tests and global functions a template can use: jinja2's built-ins as the
// sandboxed environment provides them, plus transformers' tojson, raise_exception and
// strftime_now.
#pragma once
#include <memory>
#include <string_view>

#include "text/jinja/ast.h"

namespace m3::jinja {

// Null when m3serve does not implement the filter/test.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// Whether jinja2 has the filter/test at all (an unknown name is a syntax error, as in jinja2;
// a known one m3serve lacks fails only when the template uses it).
bool is_jinja2_filter(std::string_view name);
bool is_jinja2_test(std::string_view name);

// Applies a filter/test by name at render time (for map, select and friends).
Value call_filter(Interpreter& interp, std::string_view name, const Value& input, CallArgs& args);
bool call_test(Interpreter& interp, std::string_view name, const Value& input, CallArgs& args);

// Python's int(value) / float(value) as jinja2's |int and |float use them: strings parse with
// Python's literal rules; what cannot convert gives `fallback`.
Value python_int(const Value& v, const Value& fallback, int base);
Value python_float(const Value& v, const Value& fallback);

// The global functions: range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
class Scope;
void add_globals(Scope& scope);

// Binds call arguments to named parameters as Python does; each Param without a default is
// required. Raises TypeError naming `function` for a missing, duplicate or unknown argument.
struct Param {
  Param(std::string_view name, bool required, Value default_value = Value())
      : name(name), required(required), default_value(std::move(default_value)) {}
  std::string_view name;
  bool required;
  Value default_value;
};
std::vector<Value> bind_args(std::string_view function, const CallArgs& args,
                             std::initializer_list<Param> params);

}  // namespace m3::jinja
