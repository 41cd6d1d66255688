#include "text/jinja/objects.h"

#include <fmt/format.h>

namespace m3::jinja {

std::string Namespace::repr() const {
  auto view = std::make_shared<DictData>(attrs);
  return fmt::format("<Namespace {}>", jinja::repr(Value::dict(view)));
}

bool Namespace::get_attr(std::string_view name, Value& out) {
  if (const Value* value = attrs.find(name)) {
    out = *value;
    return true;
  }
  return false;
}

std::string IteratorObject::repr() const { return fmt::format("<{} object>", type_); }

std::vector<Value> IteratorObject::iterate() {
  std::vector<Value> rest(items_.begin() + static_cast<std::ptrdiff_t>(next_), items_.end());
  next_ = items_.size();
  return rest;
}

Value make_iterator(std::vector<Value> items, const char* type) {
  return Value::object(std::make_shared<IteratorObject>(std::move(items), type));
}

std::string NativeFunction::repr() const { return fmt::format("<{} {}>", type_, name_); }

Value make_function(std::string name, NativeFunction::Fn fn, const char* type) {
  return Value::object(std::make_shared<NativeFunction>(std::move(name), std::move(fn), type));
}

}  // namespace m3::jinja
