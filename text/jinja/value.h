// The values a Jinja template computes with, modelled on the Python objects jinja2 hands
// around: None, bool, int, float, str, list, tuple, dict (insertion-ordered), the dict views
// and range, jinja2's Undefined, and objects (macros, loop, namespace, methods, iterators).
// Lists and dicts are shared by reference, as in Python.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::jinja {

class Value;
class Object;
class Interpreter;

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject };

// Sequences that share the list representation but print, index and compare differently.
enum class ListFlavor : uint8_t { kList, kTuple, kDictKeys, kDictValues, kDictItems, kRange };

// An error raised while rendering, named after the Python exception jinja2 would raise
// ("TypeError", "UndefinedError", "SecurityError", "TemplateError" for raise_exception, ...).
// The interpreter adds the template line.
class RenderError : public std::runtime_error {
 public:
  RenderError(std::string type, const std::string& message)
      : std::runtime_error(message), type(std::move(type)) {}
  std::string type;
  int line = 0;
};

[[noreturn]] void throw_error(const char* type, std::string message);

struct ListData {
  std::vector<Value> items;
  ListFlavor flavor = ListFlavor::kList;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // kRange, for repr
};

struct DictData {
  std::vector<std::pair<Value, Value>> entries;  // insertion order

  // Keys compare as Python's dict does (1 == 1.0 == True); unhashable keys raise TypeError.
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

// Why a value is undefined. The message is only formatted when the template trips over it:
// templates probe missing keys (`message.tool_calls is defined`) all the time.
struct UndefinedData {
  enum class Reason : uint8_t { kMessage, kName, kAttribute } reason = Reason::kMessage;
  std::string text;             // the message, the variable name or the attribute name
  const char* owner = nullptr;  // kAttribute: Python type name of the object
  bool unsafe = false;          // an attribute the sandbox blocks: raises SecurityError when used
};

class Value {
 public:
  Value() = default;  // Undefined with no hint
  static Value undefined(std::string message, bool unsafe = false);
  static Value undefined_name(std::string_view name);  // "'name' is undefined"
  // "'dict object' has no attribute 'x'"; owner_type is a type_name() result.
  static Value missing_attribute(const char* owner_type, std::string_view name);
  // The same for a name or attribute written in the template: the AST keeps the string, so
  // nothing is allocated (missing keys are probed on every message).
  static Value undefined_template_name(const std::string& name);
  static Value missing_template_attribute(const char* owner_type, const std::string& name);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  // A string owned elsewhere (template text, request JSON) that outlives every use of the
  // value: copies cost no reference counting.
  static Value borrowed_string(const std::string& s);
  static Value list(std::vector<Value> items, ListFlavor flavor = ListFlavor::kList);
  static Value list(std::shared_ptr<ListData> data);
  static Value dict(std::shared_ptr<DictData> data);
  static Value object(std::shared_ptr<Object> object);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python int
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_integral() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_flavor(ListFlavor flavor) const { return is_list() && list().flavor == flavor; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == Kind::kBool ? scalar_.b : scalar_.i; }
  double as_float() const { return kind_ == Kind::kFloat ? scalar_.f : static_cast<double>(as_int()); }
  const std::string& str() const { return *static_cast<const std::string*>(ptr_.get()); }
  ListData& list() const { return *static_cast<ListData*>(ptr_.get()); }
  DictData& dict() const { return *static_cast<DictData*>(ptr_.get()); }
  Object& object() const { return *static_cast<Object*>(ptr_.get()); }
  std::shared_ptr<ListData> list_ptr() const { return std::static_pointer_cast<ListData>(ptr_); }
  std::shared_ptr<Object> object_ptr() const { return std::static_pointer_cast<Object>(ptr_); }
  // What jinja2's UndefinedError (or SecurityError) would say about this Undefined.
  std::string undefined_message() const;
  bool undefined_is_unsafe() const;
  // Identity, for `is sameas` and object equality.
  const void* identity() const { return ptr_.get(); }

  // Raises the UndefinedError (or SecurityError) this Undefined stands for.
  [[noreturn]] void raise_undefined() const;

 private:
  // Undefined values made by undefined_template_name / missing_template_attribute point at the
  // AST's string instead of an UndefinedData.
  enum class BorrowedUndefined : uint8_t { kNone, kName, kAttribute };

  Kind kind_ = Kind::kUndefined;
  BorrowedUndefined borrowed_undefined_ = BorrowedUndefined::kNone;
  union {
    bool b;
    int64_t i;
    double f;
    const char* owner;  // BorrowedUndefined::kAttribute
  } scalar_{};
  std::shared_ptr<void> ptr_;
};

using Kwargs = std::vector<std::pair<std::string, Value>>;

struct CallArgs {
  std::vector<Value> positional;
  Kwargs keyword;
};

// Objects with behaviour: macros, loop, namespace, bound methods, iterators, cyclers.
class Object {
 public:
  virtual ~Object() = default;
  virtual const char* type_name() const = 0;  // Python's type(x).__name__
  virtual std::string repr() const;
  // Attribute lookup; false when there is no such attribute.
  virtual bool get_attr(std::string_view name, Value& out);
  virtual bool callable() const { return false; }
  virtual Value call(Interpreter& interp, CallArgs& args);
  virtual bool iterable() const { return false; }
  virtual std::vector<Value> iterate();
  virtual bool has_length() const { return false; }
  virtual int64_t length() const { return 0; }
};

// Python semantics of values (value.cc, value_ops.cc).
const char* type_name(const Value& v);  // "str", "int", "NoneType", "dict_items", ...
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); Undefined prints ""
void append_str(std::string& out, const Value& v);
std::string repr(const Value& v);
void append_repr(std::string& out, const Value& v);
void append_float_repr(std::string& out, double f);
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);  // a < b, TypeError across types
// a OP b for OP in "<", "<=", ">", ">=", with Python's rules (NaN, sequences, TypeError).
bool ordered_compare(std::string_view op, const Value& a, const Value& b);
void check_hashable(const Value& v);
bool is_iterable(const Value& v);

// Operators; each raises RenderError as Python would.
Value op_add(const Value& a, const Value& b);
Value op_sub(const Value& a, const Value& b);
Value op_mul(const Value& a, const Value& b);
Value op_truediv(const Value& a, const Value& b);
Value op_floordiv(const Value& a, const Value& b);
Value op_mod(const Value& a, const Value& b);
Value op_pow(const Value& a, const Value& b);
Value op_neg(const Value& a);
Value op_pos(const Value& a);
bool op_contains(const Value& container, const Value& item);  // item in container

// Sequence protocol.
std::vector<Value> iterate(const Value& v);  // materialises; consumes iterators
int64_t length(const Value& v);              // len(v)
// obj[key] with jinja2's sandbox rules (falls back to attributes, else Undefined).
Value get_item(const Value& obj, const Value& key);
// obj.name with jinja2's sandbox rules (attributes first, then items, else Undefined).
Value get_attr(const Value& obj, std::string_view name);
// The same, returning false (and leaving `out` alone) where get_attr gives "no such attribute".
bool try_get_attr(const Value& obj, std::string_view name, Value& out);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Builds a fresh tuple / dict_items pair.
Value make_tuple(std::vector<Value> items);

}  // namespace m3::jinja
