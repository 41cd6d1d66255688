// Python methods of str, dict and list that jinja2's ImmutableSandboxedEnvironment lets a
// template call (`s.strip()`, `d.items()`, `d.get(k)`, `'{}'.format(x)`, ...), and the
// printf-style `%` and str.format() formatting they need.
#pragma once
#include <string>
#include <string_view>

#include "text/jinja/value.h"

namespace m3::jinja {

// When `self` has a method `name`, stores it (bound to self) in `out` and returns true. A
// method the sandbox forbids (list.append, dict.update, ...) comes back as an unsafe Undefined
// that raises SecurityError when called.
bool lookup_method(const Value& self, std::string_view name, Value& out);

// `format % args` (args: a tuple for several values, a dict for %(name)s).
std::string percent_format(const std::string& format, const Value& args);
// str.format(*args, **kwargs).
std::string brace_format(const std::string& format, const CallArgs& args);

}  // namespace m3::jinja
