#include "text/jinja/pyjson.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "text/jinja/pystr.h"

namespace m3::jinja {

Value from_json(const nlohmann::ordered_json& json) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null: return Value::none();
    case Type::boolean: return Value::boolean(json.get<bool>());
    case Type::number_integer: return Value::integer(json.get<int64_t>());
    case Type::number_unsigned: {
      auto u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case Type::number_float: return Value::number(json.get<double>());
    case Type::string: return Value::borrowed_string(json.get_ref<const std::string&>());
    case Type::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case Type::object: {
      auto dict = std::make_shared<DictData>();
      dict->entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict->entries.emplace_back(Value::borrowed_string(it.key()), from_json(it.value()));
      }
      return Value::dict(std::move(dict));
    }
    default: throw_error("TypeError", "binary JSON values cannot be passed to a template");
  }
}

namespace {

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {
    item_separator_ = options.item_separator.value_or(options.indent ? "," : ", ");
    key_separator_ = options.key_separator.value_or(": ");
  }

  void write(const Value& v, int level) {
    switch (v.kind()) {
      case Kind::kNone: out_ += "null"; return;
      case Kind::kBool: out_ += v.as_bool() ? "true" : "false"; return;
      case Kind::kInt: out_ += fmt::format("{}", v.as_int()); return;
      case Kind::kFloat: write_float(v.as_float()); return;
      case Kind::kString: write_string(v.str()); return;
      case Kind::kList:
        if (v.is_flavor(ListFlavor::kList) || v.is_flavor(ListFlavor::kTuple)) {
          write_list(v.list().items, level);
          return;
        }
        break;
      case Kind::kDict: write_dict(v.dict(), level); return;
      default: break;
    }
    throw_error("TypeError", fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }

  std::string take() { return std::move(out_); }

 private:
  void write_float(double f) {
    if (std::isnan(f)) {
      out_ += "NaN";
    } else if (std::isinf(f)) {
      out_ += f < 0 ? "-Infinity" : "Infinity";
    } else {
      append_float_repr(out_, f);
    }
  }

  void write_string(const std::string& s) {
    static const char* hex = "0123456789abcdef";
    out_.push_back('"');
    auto escape_unit = [&](unsigned unit) {
      out_ += "\\u";
      for (int k = 3; k >= 0; --k) out_.push_back(hex[(unit >> (4 * k)) & 0xF]);
    };
    auto escape_simple = [&](unsigned char ch) {
      switch (ch) {
        case '"': out_ += "\\\""; return true;
        case '\\': out_ += "\\\\"; return true;
        case '\n': out_ += "\\n"; return true;
        case '\r': out_ += "\\r"; return true;
        case '\t': out_ += "\\t"; return true;
        case '\b': out_ += "\\b"; return true;
        case '\f': out_ += "\\f"; return true;
        default:
          if (ch < 0x20) {
            escape_unit(ch);
            return true;
          }
          return false;
      }
    };
    if (!options_.ensure_ascii) {
      for (char ch : s) {
        if (!escape_simple(static_cast<unsigned char>(ch))) out_.push_back(ch);
      }
    } else {
      for (char32_t c : pystr::decode(s)) {
        if (c < 0x80) {
          if (!escape_simple(static_cast<unsigned char>(c))) out_.push_back(static_cast<char>(c));
        } else if (c < 0x10000) {
          escape_unit(c);
        } else {
          char32_t v = c - 0x10000;
          escape_unit(0xD800 | (v >> 10));
          escape_unit(0xDC00 | (v & 0x3FF));
        }
      }
    }
    out_.push_back('"');
  }

  void newline(int level) {
    out_.push_back('\n');
    for (int k = 0; k < level; ++k) out_ += *options_.indent;
  }

  void write_list(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_.push_back('[');
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out_ += item_separator_;
      if (options_.indent) newline(level + 1);
      write(items[k], level + 1);
    }
    if (options_.indent) newline(level);
    out_.push_back(']');
  }

  void write_key(const Value& key) {
    switch (key.kind()) {
      case Kind::kString: write_string(key.str()); return;
      case Kind::kNone: out_ += "\"null\""; return;
      case Kind::kBool: out_ += key.as_bool() ? "\"true\"" : "\"false\""; return;
      case Kind::kInt: out_ += fmt::format("\"{}\"", key.as_int()); return;
      case Kind::kFloat: {
        std::string text;
        if (std::isnan(key.as_float())) {
          text = "NaN";
        } else if (std::isinf(key.as_float())) {
          text = key.as_float() < 0 ? "-Infinity" : "Infinity";
        } else {
          append_float_repr(text, key.as_float());
        }
        write_string(text);
        return;
      }
      default:
        throw_error("TypeError", fmt::format("keys must be str, int, float, bool or None, not {}",
                                             type_name(key)));
    }
  }

  void write_dict(const DictData& dict, int level) {
    if (dict.entries.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& entry : dict.entries) entries.push_back(&entry);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return less(a->first, b->first); });
    }
    out_.push_back('{');
    bool first = true;
    for (const auto* entry : entries) {
      if (!first) out_ += item_separator_;
      first = false;
      if (options_.indent) newline(level + 1);
      write_key(entry->first);
      out_ += key_separator_;
      write(entry->second, level + 1);
    }
    if (options_.indent) newline(level);
    out_.push_back('}');
  }

  const JsonDumpOptions& options_;
  std::string item_separator_, key_separator_;
  std::string out_;
};

}  // namespace

std::string json_dumps(const Value& value, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  writer.write(value, 0);
  return writer.take();
}

}  // namespace m3::jinja
