// The objects a template can hold besides plain data: namespace(), one-shot iterators (what
// jinja2's map/select/... return), native functions and bound methods.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "text/jinja/value.h"

namespace m3::jinja {

// namespace(): the one mutable object a sandboxed template has ({% set ns.x = ... %}).
class Namespace : public Object {
 public:
  DictData attrs;
  const char* type_name() const override { return "Namespace"; }
  std::string repr() const override;
  bool get_attr(std::string_view name, Value& out) override;
};

// A Python generator or iterator: always true, no len(), consumed by the first iteration.
class IteratorObject : public Object {
 public:
  IteratorObject(std::vector<Value> items, const char* type) : items_(std::move(items)), type_(type) {}
  const char* type_name() const override { return type_; }
  std::string repr() const override;
  bool iterable() const override { return true; }
  std::vector<Value> iterate() override;

 private:
  std::vector<Value> items_;
  size_t next_ = 0;
  const char* type_;
};

Value make_iterator(std::vector<Value> items, const char* type = "generator");

class NativeFunction : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  NativeFunction(std::string name, Fn fn, const char* type = "function")
      : name_(std::move(name)), fn_(std::move(fn)), type_(type) {}
  const char* type_name() const override { return type_; }
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Interpreter& interp, CallArgs& args) override { return fn_(interp, args); }

 private:
  std::string name_;
  Fn fn_;
  const char* type_;
};

Value make_function(std::string name, NativeFunction::Fn fn,
                    const char* type = "builtin_function_or_method");

}  // namespace m3::jinja
