// Python's two string formatting languages: printf-style `fmt % args` (and jinja2's |format)
// and str.format() with the format-spec mini-language.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "text/jinja/builtins.h"
#include "text/jinja/methods.h"
#include "text/jinja/pystr.h"

namespace m3::jinja {
namespace {

struct Spec {
  char fill = ' ';
  char align = 0;  // '<', '>', '^', '=' or 0 for the type's default
  char sign = '-';
  bool alternate = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

int64_t to_int_for_format(const Value& v, char type) {
  if (v.is_integral()) return v.as_int();
  if (v.is_float() && type != 'c') {
    if (!std::isfinite(v.as_float())) throw_error("OverflowError", "cannot convert float infinity to integer");
    return static_cast<int64_t>(v.as_float());
  }
  throw_error("TypeError", fmt::format("%{} format: a real number is required, not {}", type, type_name(v)));
}

std::string group_digits(const std::string& digits, char separator, int group) {
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int k = 0; k < n; ++k) {
    if (k > 0 && (n - k) % group == 0) out.push_back(separator);
    out.push_back(digits[k]);
  }
  return out;
}

// Lays out sign + prefix + digits in a field (zero padding goes between prefix and digits).
std::string layout_number(const std::string& sign, const std::string& prefix, const std::string& body,
                          const Spec& spec, char default_align) {
  std::string text = sign + prefix + body;
  int64_t n = static_cast<int64_t>(pystr::length(text));
  if (spec.width <= n) return text;
  char align = spec.align ? spec.align : (spec.zero ? '=' : default_align);
  char fill = spec.align ? spec.fill : (spec.zero ? '0' : spec.fill);
  if (align == '=') return sign + prefix + std::string(spec.width - n, fill) + body;
  return pystr::pad(text, spec.width, static_cast<unsigned char>(fill), align);
}

std::string format_int(int64_t value, const Spec& spec) {
  char type = spec.type ? spec.type : 'd';
  uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::string digits;
  std::string prefix;
  switch (type) {
    case 'd':
    case 'i':
    case 'u':
    case 'n': digits = fmt::format("{}", magnitude); break;
    case 'x': digits = fmt::format("{:x}", magnitude), prefix = spec.alternate ? "0x" : ""; break;
    case 'X': digits = fmt::format("{:X}", magnitude), prefix = spec.alternate ? "0X" : ""; break;
    case 'o': digits = fmt::format("{:o}", magnitude), prefix = spec.alternate ? "0o" : ""; break;
    case 'b': digits = fmt::format("{:b}", magnitude), prefix = spec.alternate ? "0b" : ""; break;
    default: throw_error("ValueError", fmt::format("Unknown format code '{}' for object of type 'int'", type));
  }
  if (spec.precision >= 0 && static_cast<int64_t>(digits.size()) < spec.precision) {
    digits.insert(0, spec.precision - digits.size(), '0');  // printf-style minimum digits
  }
  if (spec.grouping) digits = group_digits(digits, spec.grouping, type == 'd' || type == 'n' ? 3 : 4);
  std::string sign = value < 0 ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  return layout_number(sign, prefix, digits, spec, '>');
}

std::string format_float(double value, const Spec& spec) {
  char type = spec.type;
  int64_t precision = spec.precision;
  bool python_general = type == 0;  // str.format with no type: 'g' that keeps a ".0"
  if (type == 0) {
    if (precision < 0) {
      std::string repr_text;
      append_float_repr(repr_text, std::fabs(value));
      std::string sign = std::signbit(value) ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
      return layout_number(sign, "", repr_text, spec, '>');
    }
    type = 'g';
  }
  if (precision < 0) precision = 6;
  bool percent = type == '%';
  double shown = percent ? value * 100 : value;
  char c_type = percent ? 'f' : type == 'n' ? 'g' : type;
  std::string flags = spec.alternate ? "#" : "";
  std::string c_format = "%" + flags + ".*" + std::string(1, c_type);
  int size = std::snprintf(nullptr, 0, c_format.c_str(), static_cast<int>(precision), std::fabs(shown));
  std::string body(static_cast<size_t>(size) + 1, '\0');
  std::snprintf(body.data(), body.size(), c_format.c_str(), static_cast<int>(precision), std::fabs(shown));
  body.resize(static_cast<size_t>(size));
  if (python_general && body.find_first_of(".eEn") == std::string::npos) body += ".0";
  if (spec.grouping) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = group_digits(body.substr(0, end), spec.grouping, 3) + body.substr(end);
  }
  if (percent) body += "%";
  std::string sign = std::signbit(shown) && !(std::isnan(shown))
                         ? "-"
                         : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  return layout_number(sign, "", body, spec, '>');
}

std::string format_text(std::string text, const Spec& spec) {
  if (spec.precision >= 0) {
    std::u32string chars = pystr::decode(text);
    if (static_cast<int64_t>(chars.size()) > spec.precision) text = pystr::encode(chars.substr(0, spec.precision));
  }
  if (spec.width < 0) return text;
  return pystr::pad(text, spec.width, static_cast<unsigned char>(spec.fill), spec.align ? spec.align : '<');
}

// One value under a format-spec (str.format) or printf conversion.
std::string format_value(const Value& v, Spec spec, bool printf_style) {
  char type = spec.type;
  if (printf_style) {
    switch (type) {
      case 's': return format_text(to_str(v), spec);
      case 'r':
      case 'a': return format_text(repr(v), spec);
      case 'c': {
        std::string ch;
        if (v.is_string()) {
          if (pystr::length(v.str()) != 1) throw_error("TypeError", "%c requires int or char");
          ch = v.str();
        } else {
          pystr::append_utf8(ch, static_cast<char32_t>(to_int_for_format(v, 'c')));
        }
        spec.precision = -1;
        return format_text(ch, spec);
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X': return format_int(to_int_for_format(v, type), spec);
      default:
        if (!v.is_number()) {
          throw_error("TypeError", fmt::format("must be real number, not {}", type_name(v)));
        }
        return format_float(v.as_float(), spec);
    }
  }
  if (v.is_string() || v.is_undefined()) {
    if (type != 0 && type != 's') {
      throw_error("ValueError", fmt::format("Unknown format code '{}' for object of type 'str'", type));
    }
    return format_text(to_str(v), spec);
  }
  if (v.is_integral()) {
    bool as_text = v.is_bool() && type == 0 && spec.width < 0 && spec.precision < 0 && !spec.grouping;
    if (as_text) return to_str(v);
    if (type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'n') {
      return format_int(v.as_int(), spec);
    }
    if (type == 'c') {
      std::string ch;
      pystr::append_utf8(ch, static_cast<char32_t>(v.as_int()));
      return format_text(ch, spec);
    }
    return format_float(v.as_float(), spec);
  }
  if (v.is_float()) return format_float(v.as_float(), spec);
  bool empty_spec = type == 0 && spec.width < 0 && spec.precision < 0 && !spec.align && !spec.grouping;
  if (!empty_spec) {
    throw_error("TypeError", fmt::format("unsupported format string passed to {}.__format__", type_name(v)));
  }
  return to_str(v);
}

int64_t parse_count(std::string_view s, size_t& i) {
  int64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') n = n * 10 + (s[i++] - '0');
  return n;
}

Spec parse_format_spec(std::string_view s) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char ch) { return ch == '<' || ch == '>' || ch == '^' || ch == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0], spec.align = s[1], i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0], i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '#') spec.alternate = true, ++i;
  if (i < s.size() && s[i] == '0') spec.zero = true, ++i;
  if (i < s.size() && s[i] >= '0' && s[i] <= '9') spec.width = parse_count(s, i);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = parse_count(s, i);
  }
  if (i < s.size()) spec.type = s[i++];
  if (i != s.size()) throw_error("ValueError", "Invalid format specifier");
  return spec;
}

}  // namespace

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> positional;
  const DictData* mapping = args.is_dict() ? &args.dict() : nullptr;
  if (args.is_flavor(ListFlavor::kTuple)) {
    positional = args.list().items;
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next >= positional.size()) throw_error("TypeError", "not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) throw_error("ValueError", "incomplete format");
    const Value* keyed = nullptr;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos) throw_error("ValueError", "incomplete format key");
      if (mapping == nullptr) throw_error("TypeError", "format requires a mapping");
      std::string key = format.substr(i + 1, close - i - 1);
      keyed = mapping->find(std::string_view(key));
      if (keyed == nullptr) throw_error("KeyError", repr(Value::string(key)));
      used_mapping = true;
      i = close + 1;
    }
    Spec spec;
    spec.align = '>';
    for (; i < format.size(); ++i) {
      char ch = format[i];
      if (ch == '-') {
        spec.align = '<';
      } else if (ch == '0') {
        spec.zero = true;
      } else if (ch == '+') {
        spec.sign = '+';
      } else if (ch == ' ') {
        if (spec.sign != '+') spec.sign = ' ';
      } else if (ch == '#') {
        spec.alternate = true;
      } else {
        break;
      }
    }
    if (i < format.size() && format[i] == '*') {
      spec.width = to_int_for_format(take(), '*'), ++i;
      if (spec.width < 0) spec.align = '<', spec.width = -spec.width;
    } else if (i < format.size() && format[i] >= '0' && format[i] <= '9') {
      spec.width = parse_count(format, i);
    }
    if (i < format.size() && format[i] == '.') {
      ++i;
      if (i < format.size() && format[i] == '*') {
        spec.precision = to_int_for_format(take(), '*'), ++i;
      } else {
        spec.precision = parse_count(format, i);
      }
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) throw_error("ValueError", "incomplete format");
    char type = format[i];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (std::string_view("sradiouxXeEfFgGc").find(type) == std::string_view::npos) {
      throw_error("ValueError", fmt::format("unsupported format character '{}' (0x{:x}) at index {}", type,
                                            static_cast<int>(type), i));
    }
    if (spec.zero && spec.align == '<') spec.zero = false;
    if (spec.zero) spec.align = 0;
    if (spec.align == '>' && !spec.zero) spec.align = 0;
    spec.type = type;
    const Value& v = keyed ? *keyed : take();
    if (spec.align == 0 && (type == 's' || type == 'r' || type == 'a' || type == 'c')) {
      spec.align = '>';
    }
    out += format_value(v, spec, true);
  }
  if (next < positional.size() && !used_mapping && !(mapping && positional.size() == 1)) {
    throw_error("TypeError", "not all arguments converted during string formatting");
  }
  return out;
}

std::string brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char ch = format[i];
    if (ch == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      throw_error("ValueError", "Single '}' encountered in format string");
    }
    if (ch != '{') {
      out.push_back(ch);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = format.find('}', i);
    if (close == std::string::npos) throw_error("ValueError", "expected '}' before end of string");
    std::string field = format.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string::npos) {
      throw_error("ValueError", "nested replacement fields are not supported by m3serve's str.format");
    }
    i = close;
    std::string spec_text, conversion;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec_text = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = field.substr(bang + 1);
      field.resize(bang);
    }
    // field name: first part, then .attr / [key] chains
    size_t end = field.find_first_of(".[");
    std::string first = field.substr(0, end);
    Value v;
    if (first.empty()) {
      if (auto_index >= args.positional.size()) {
        throw_error("IndexError", fmt::format("Replacement index {} out of range for positional args tuple",
                                              auto_index));
      }
      v = args.positional[auto_index++];
    } else if (first.find_first_not_of("0123456789") == std::string::npos) {
      size_t index = std::stoul(first);
      if (index >= args.positional.size()) {
        throw_error("IndexError", fmt::format("Replacement index {} out of range for positional args tuple",
                                              index));
      }
      v = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [name, value] : args.keyword) {
        if (name == first) v = value, found = true;
      }
      if (!found) throw_error("KeyError", repr(Value::string(first)));
    }
    while (end != std::string::npos && end < field.size()) {
      if (field[end] == '.') {
        size_t next = field.find_first_of(".[", end + 1);
        v = get_attr(v, field.substr(end + 1, next == std::string::npos ? std::string::npos : next - end - 1));
        end = next;
      } else {
        size_t close_bracket = field.find(']', end);
        if (close_bracket == std::string::npos) throw_error("ValueError", "Missing ']' in format string");
        std::string key = field.substr(end + 1, close_bracket - end - 1);
        Value key_value = key.find_first_not_of("0123456789") == std::string::npos && !key.empty()
                              ? Value::integer(std::stoll(key))
                              : Value::string(key);
        v = get_item(v, key_value);
        end = close_bracket + 1 < field.size() ? close_bracket + 1 : std::string::npos;
      }
    }
    if (conversion == "r" || conversion == "a") {
      v = Value::string(repr(v));
    } else if (conversion == "s") {
      v = Value::string(to_str(v));
    } else if (!conversion.empty()) {
      throw_error("ValueError", fmt::format("Unknown conversion specifier {}", conversion));
    }
    out += format_value(v, parse_format_spec(spec_text), false);
  }
  return out;
}

}  // namespace m3::jinja
