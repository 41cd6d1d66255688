#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "grammar/grammar_error.h"
#include "grammar/regex.h"

namespace m3::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDigits = 15;
constexpr int kMaxRefDepth = 64;

[[noreturn]] void unsupported(const std::string& path, const std::string& why) {
  throw GrammarError(path, fmt::format("{}: {}", path, why));
}

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "strict", "name"};

// JSON string body characters of a code-point set: plain where JSON allows them, escaped for '"',
// '\' and control characters (one spelling each: \n \t \r \b \f, else \u00XX); `excluded` (0:
// none) left out.
int32_t json_chars(Grammar& g, const CodePointRanges& ranges, uint32_t excluded) {
  CodePointRanges plain;
  std::vector<int32_t> options;
  for (auto [lo, hi] : ranges) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      static constexpr std::pair<uint32_t, const char*> kShort[] = {
          {'\n', "\\n"}, {'\t', "\\t"}, {'\r', "\\r"}, {'\b', "\\b"}, {'\f', "\\f"}};
      std::string esc = fmt::format("\\u{:04x}", c);
      for (auto [k, s] : kShort)
        if (k == c) esc = s;
      options.push_back(g.byte_string(esc));
    }
    if (hi >= 0x20) plain.emplace_back(std::max<uint32_t>(lo, 0x20), hi);
  }
  std::vector<uint32_t> specials = {0x22, 0x5C};  // the quote and the backslash, escaped
  if (excluded >= 0x20 && excluded != 0x22 && excluded != 0x5C) specials.push_back(excluded);
  std::sort(specials.begin(), specials.end());
  CodePointRanges kept;
  for (auto [lo, hi] : plain) {
    uint32_t from = lo;
    for (uint32_t special : specials) {
      if (special < from || special > hi) continue;
      if (special > from) kept.emplace_back(from, special - 1);
      if (special == 0x22) options.push_back(g.byte_string("\\\""));
      if (special == 0x5C) options.push_back(g.byte_string("\\\\"));
      from = special + 1;
    }
    if (from <= hi) kept.emplace_back(from, hi);
  }
  if (!kept.empty()) options.push_back(g.chars(kept));
  return g.alt(std::move(options));
}

// The characters of a code-point set as such (raw strings of tool-call markup), `excluded` (0:
// none) left out.
int32_t raw_chars(Grammar& g, const CodePointRanges& ranges, uint32_t excluded) {
  if (excluded == 0) return g.chars(ranges);
  CodePointRanges kept;
  for (auto [lo, hi] : ranges) {
    if (lo <= excluded && hi >= excluded) {
      if (lo < excluded) kept.emplace_back(lo, excluded - 1);
      if (hi > excluded) kept.emplace_back(excluded + 1, hi);
    } else {
      kept.emplace_back(lo, hi);
    }
  }
  return g.chars(kept);
}

// The formats' texts (years 1000-9999, days 01-28: every such date exists).
const char* format_regex(std::string_view format) {
  static constexpr std::pair<std::string_view, const char*> kFormats[] = {
      {"date", R"([1-9]\d{3}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8]))"},
      {"time", R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"date-time",
       R"([1-9]\d{3}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"uuid", R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"},
      {"email", R"([a-zA-Z0-9_+\-]{1,32}(\.[a-zA-Z0-9_+\-]{1,32}){0,3}@[a-zA-Z0-9\-]{1,32}(\.[a-zA-Z0-9\-]{1,32}){1,3})"},
      {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
  };
  for (auto [name, re] : kFormats)
    if (name == format) return re;
  return nullptr;
}

// The JSON types a schema may produce (for oneOf disjointness), from type / const / enum.
std::set<std::string> value_types(const Json& v) {
  if (v.is_null()) return {"null"};
  if (v.is_boolean()) return {"boolean"};
  if (v.is_number_integer() || v.is_number_unsigned()) return {"integer"};
  if (v.is_number()) return {"number"};
  if (v.is_string()) return {"string"};
  if (v.is_array()) return {"array"};
  return {"object"};
}

}  // namespace

struct JsonSchemaCompiler::Impl {
  Grammar& g;
  const Json& root;
  JsonSchemaOptions o;
  int32_t any_value_rule = -1, any_object_rule = -1;
  std::vector<const Json*> ref_stack;
  std::map<const Json*, int32_t> ref_rules;

  Impl(Grammar& grammar, const Json& r, JsonSchemaOptions options) : g(grammar), root(r), o(std::move(options)) {}
  int32_t any_value();

  int32_t lit(std::string_view s) { return g.byte_string(s); }
  int32_t sep(char c) { return g.seq({lit(std::string(1, c)), g.optional(lit(" "))}); }
  int32_t digits(int min, int max) { return g.repeat(g.chars({{'0', '9'}}), min, max); }

  int32_t string_body_chars() {
    return g.alt({json_chars(g, {{0, kMaxCodePoint}}, o.excluded_char),
                  // \uXXXX escapes outside the surrogates (Python counts a pair as one character).
                  g.seq({lit("\\u"),
                         g.alt({g.seq({g.chars({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}),
                                       g.repeat(g.chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}), 3, 3)}),
                                g.seq({g.chars({{'d', 'd'}, {'D', 'D'}}), g.chars({{'0', '7'}}),
                                       g.repeat(g.chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}), 2, 2)})})})});
  }
  int32_t any_string() { return g.seq({lit("\""), g.star(string_body_chars()), lit("\"")}); }

  int32_t uint_same_length(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return g.empty();
    if (lo.find_first_not_of('0') == std::string::npos && hi.find_first_not_of('9') == std::string::npos)
      return digits(int(lo.size()), int(lo.size()));
    if (lo[0] == hi[0]) return g.seq({g.chars({{uint32_t(lo[0]), uint32_t(lo[0])}}), uint_same_length(lo.substr(1), hi.substr(1))});
    const size_t rest = lo.size() - 1;
    std::vector<int32_t> options;
    options.push_back(g.seq({g.chars({{uint32_t(lo[0]), uint32_t(lo[0])}}), uint_same_length(lo.substr(1), std::string(rest, '9'))}));
    if (hi[0] - lo[0] > 1)
      options.push_back(g.seq({g.chars({{uint32_t(lo[0] + 1), uint32_t(hi[0] - 1)}}), digits(int(rest), int(rest))}));
    options.push_back(g.seq({g.chars({{uint32_t(hi[0]), uint32_t(hi[0])}}), uint_same_length(std::string(rest, '0'), hi.substr(1))}));
    return g.alt(std::move(options));
  }

  // Decimal texts (no leading zeros) of the integers in [a, b], 0 <= a.
  int32_t uint_range(uint64_t a, uint64_t b) {
    std::vector<int32_t> options;
    uint64_t low = 0, high = 9;
    for (int d = 1; d <= 19 && low <= b; ++d) {
      const uint64_t lo = std::max(a, low), hi = std::min(b, high);
      if (lo <= hi) options.push_back(uint_same_length(std::to_string(lo), std::to_string(hi)));
      low = high + 1;
      if (d == 19) break;
      high = high * 10 + 9;
    }
    return g.alt(std::move(options));
  }

  int32_t int_range(int64_t lo, int64_t hi) {
    std::vector<int32_t> options;
    if (lo < 0) options.push_back(g.seq({lit("-"), uint_range(uint64_t(std::max<int64_t>(-hi, 1)), uint64_t(-lo))}));
    if (hi >= 0) options.push_back(uint_range(uint64_t(std::max<int64_t>(lo, 0)), uint64_t(hi)));
    return g.alt(std::move(options));
  }

  // Non-negative decimals m with a <= m <= b (exclusive ends as flagged), a, b integers.
  int32_t magnitude_range(int64_t a, int64_t b, bool a_excl, bool b_excl) {
    const int32_t any_fraction = g.optional(g.seq({lit("."), digits(1, kMaxDigits)}));
    const int32_t zero_fraction = g.optional(g.seq({lit("."), g.repeat(lit("0"), 1, kMaxDigits)}));
    const int32_t nonzero_fraction =
        g.seq({lit("."), digits(0, kMaxDigits - 1), g.chars({{'1', '9'}}), digits(0, kMaxDigits - 1)});
    std::vector<int32_t> options;
    if (a == b) {
      if (!a_excl && !b_excl) options.push_back(g.seq({uint_range(uint64_t(a), uint64_t(a)), zero_fraction}));
      return g.alt(std::move(options));
    }
    if (a + 1 <= b - 1) options.push_back(g.seq({uint_range(uint64_t(a + 1), uint64_t(b - 1)), any_fraction}));
    options.push_back(g.seq({uint_range(uint64_t(a), uint64_t(a)), a_excl ? nonzero_fraction : any_fraction}));
    if (!b_excl) options.push_back(g.seq({uint_range(uint64_t(b), uint64_t(b)), zero_fraction}));
    return g.alt(std::move(options));
  }

  struct Bounds {
    std::optional<double> lo, hi;
    bool lo_excl = false, hi_excl = false;
  };
  Bounds bounds(const Json& s, const std::string& path) {
    Bounds b;
    auto num = [&](const char* k) -> std::optional<double> {
      auto it = s.find(k);
      if (it == s.end()) return std::nullopt;
      if (!it->is_number()) unsupported(path + "." + k, "must be a number");
      return it->get<double>();
    };
    b.lo = num("minimum");
    b.hi = num("maximum");
    if (auto e = num("exclusiveMinimum"); e && (!b.lo || *e >= *b.lo)) b.lo = e, b.lo_excl = true;
    if (auto e = num("exclusiveMaximum"); e && (!b.hi || *e <= *b.hi)) b.hi = e, b.hi_excl = true;
    return b;
  }

  int32_t integer(const Json& s, const std::string& path) {
    const Bounds b = bounds(s, path);
    const double cap = 999999999999999.0;  // kMaxDigits digits
    double lo = -cap, hi = cap;
    if (b.lo) lo = std::max(lo, b.lo_excl ? std::floor(*b.lo) + 1 : std::ceil(*b.lo));
    if (b.hi) hi = std::min(hi, b.hi_excl ? std::ceil(*b.hi) - 1 : std::floor(*b.hi));
    if (lo > hi) unsupported(path, "no integer satisfies minimum / maximum");
    return int_range(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }

  int32_t number(const Json& s, const std::string& path) {
    const Bounds b = bounds(s, path);
    if (!b.lo && !b.hi) {
      return g.seq({g.optional(lit("-")), g.alt({lit("0"), g.seq({g.chars({{'1', '9'}}), digits(0, kMaxDigits - 1)})}),
                    g.optional(g.seq({lit("."), digits(1, kMaxDigits)})),
                    g.optional(g.seq({g.chars({{'e', 'e'}, {'E', 'E'}}), g.optional(g.chars({{'+', '+'}, {'-', '-'}})),
                                      digits(1, 2)}))});
    }
    auto integral = [&](std::optional<double> v, const char* key) {
      if (v && (*v != std::floor(*v) || std::fabs(*v) > 1e15))
        unsupported(path + "." + key, "bounds of a 'number' are enforced only when they are integers up to 1e15");
    };
    integral(b.lo, b.lo_excl ? "exclusiveMinimum" : "minimum");
    integral(b.hi, b.hi_excl ? "exclusiveMaximum" : "maximum");
    const int64_t cap = 999999999999999;
    const int64_t lo = b.lo ? static_cast<int64_t>(*b.lo) : -cap, hi = b.hi ? static_cast<int64_t>(*b.hi) : cap;
    const bool lo_excl = b.lo && b.lo_excl, hi_excl = b.hi && b.hi_excl;
    if (lo > hi || (lo == hi && (lo_excl || hi_excl))) unsupported(path, "no number satisfies minimum / maximum");
    std::vector<int32_t> options;
    if (hi >= 0) options.push_back(magnitude_range(std::max<int64_t>(lo, 0), hi, lo >= 0 && lo_excl, hi_excl));
    if (lo < 0) {
      // -m with m in [max(-hi, 0), -lo]; m = 0 is the non-negative branch's when hi >= 0.
      const int64_t m_lo = std::max<int64_t>(-hi, 0);
      const bool m_lo_excl = hi >= 0 ? true : hi_excl;
      options.push_back(g.seq({lit("-"), magnitude_range(m_lo, -lo, m_lo_excl, lo_excl)}));
    }
    return g.alt(std::move(options));
  }

  // The characters of a string (without quotes): JSON-escaped, or raw for tool-call values.
  int32_t string_content(const Json& s, const std::string& path, bool raw) {
    const auto int_keyword = [&](const char* k) -> std::optional<int64_t> {
      auto it = s.find(k);
      if (it == s.end()) return std::nullopt;
      if (!it->is_number_integer() && !it->is_number_unsigned()) unsupported(path + "." + k, "must be an integer");
      const int64_t v = it->get<int64_t>();
      if (v < 0) unsupported(path + "." + k, "must be >= 0");
      if (v > kMaxRegexRepeat) unsupported(path + "." + k, fmt::format("above {} is not supported", kMaxRegexRepeat));
      return v;
    };
    const auto min_len = int_keyword("minLength"), max_len = int_keyword("maxLength");
    const bool has_pattern = s.contains("pattern"), has_format = s.contains("format");
    if ((has_pattern || has_format) && (min_len || max_len)) {
      unsupported(path + (min_len ? ".minLength" : ".maxLength"), "length limits together with a pattern or format are not supported");
    }
    if (has_pattern && has_format) unsupported(path + ".format", "format together with pattern is not supported");
    RegexOptions ro;
    ro.chars = [this, raw](Grammar& gr, const CodePointRanges& r) {
      return raw ? raw_chars(gr, r, o.excluded_char) : json_chars(gr, r, o.excluded_char);
    };
    if (has_pattern) {
      const Json& p = s["pattern"];
      if (!p.is_string()) unsupported(path + ".pattern", "must be a string");
      ro.what = path + ".pattern";
      ro.search = true;
      return parse_regex(g, p.get<std::string>(), ro);
    }
    if (has_format) {
      const Json& f = s["format"];
      const char* re = f.is_string() ? format_regex(f.get<std::string>()) : nullptr;
      if (!re) unsupported(path + ".format", fmt::format("format {} is not supported (date, time, date-time, uuid, email, ipv4)", f.dump()));
      ro.what = path + ".format";
      return parse_regex(g, re, ro);
    }
    const int32_t ch = raw ? raw_chars(g, {{0, kMaxCodePoint}}, o.excluded_char) : string_body_chars();
    const int64_t lo = min_len.value_or(0);
    const int64_t hi = max_len ? *max_len : -1;
    if (hi >= 0 && hi < lo) unsupported(path + ".maxLength", "is below minLength");
    return g.repeat(ch, static_cast<int32_t>(lo), static_cast<int32_t>(hi));
  }

  int32_t string(const Json& s, const std::string& path) {
    return g.seq({lit("\""), string_content(s, path, false), lit("\"")});
  }

  int32_t literal_value(const Json& v) { return lit(compact(v)); }
  std::string compact(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

  int32_t array(const Json& s, const std::string& path) {
    std::vector<const Json*> prefix;
    std::vector<std::string> prefix_paths;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) unsupported(path + ".prefixItems", "must be an array");
      for (size_t i = 0; i < it->size(); ++i) {
        prefix.push_back(&(*it)[i]);
        prefix_paths.push_back(fmt::format("{}.prefixItems[{}]", path, i));
      }
    }
    const Json* items = nullptr;
    bool items_allowed = true;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean()) items_allowed = it->get<bool>();
      else if (it->is_object()) items = &*it;
      else unsupported(path + ".items", "must be a schema (an array of schemas is prefixItems)");
    }
    auto count = [&](const char* k) -> std::optional<int64_t> {
      auto it = s.find(k);
      if (it == s.end()) return std::nullopt;
      if (!it->is_number_integer() && !it->is_number_unsigned()) unsupported(path + "." + k, "must be an integer");
      const int64_t v = it->get<int64_t>();
      if (v < 0 || v > kMaxRegexRepeat) unsupported(path + "." + k, fmt::format("must be in [0, {}]", kMaxRegexRepeat));
      return v;
    };
    int64_t min = count("minItems").value_or(0);
    std::optional<int64_t> max = count("maxItems");
    if (!items_allowed) max = std::min<int64_t>(max.value_or(int64_t(prefix.size())), int64_t(prefix.size()));
    if (max && *max < min) unsupported(path + ".minItems", "is above maxItems (or the items allowed)");
    auto element = [&](int64_t i) {
      if (i < static_cast<int64_t>(prefix.size())) return value(*prefix[size_t(i)], prefix_paths[size_t(i)]);
      return items ? value(*items, path + ".items") : any_value();
    };
    // tail(i): elements i.. once element i - 1 is written, each with its separator; elements at
    // positions >= min are optional; an unbounded array repeats `items` after the fixed ones.
    if (max && *max == 0) return lit("[]");
    const int64_t fixed = std::max<int64_t>(min, int64_t(prefix.size()));
    const int64_t end = max ? *max : std::max<int64_t>(fixed, 1);
    int32_t tail = max ? g.empty() : g.star(g.seq({sep(','), element(end)}));
    for (int64_t i = end - 1; i >= 1; --i) {
      const int32_t t = g.seq({sep(','), element(i), tail});
      tail = i < min ? t : g.optional(t);
    }
    int32_t body = g.seq({element(0), tail});
    if (min == 0) body = g.optional(body);
    return g.seq({lit("["), body, lit("]")});
  }

  int32_t object(const Json& s, const std::string& path) {
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) unsupported(path + ".properties", "must be an object");
      props = &*it;
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) unsupported(path + ".required", "must be an array of names");
      for (const Json& n : *it) {
        if (!n.is_string()) unsupported(path + ".required", "must be an array of names");
        required.insert(n.get<std::string>());
      }
    }
    const Json* additional = nullptr;
    bool additional_allowed = true;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) additional_allowed = it->get<bool>();
      else if (it->is_object()) additional = &*it;
      else unsupported(path + ".additionalProperties", "must be a boolean or a schema");
    }
    for (const char* k : {"patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                          "dependentSchemas", "unevaluatedProperties"})
      if (s.contains(k)) unsupported(path + "." + k, "is not supported");
    if ((!props || props->empty()) && additional_allowed) {
      if (required.empty()) {
        // A map: any keys, values of additionalProperties (any value when it is absent or true).
        const int32_t key_value = g.seq({any_string(), sep(':'), additional ? value(*additional, path + ".additionalProperties") : any_value()});
        return g.seq({lit("{"), g.optional(g.seq({key_value, g.star(g.seq({sep(','), key_value}))})), lit("}")});
      }
    }
    struct Prop {
      std::string name;
      const Json* schema;
      bool required;
    };
    std::vector<Prop> list;
    if (props)
      for (auto it = props->begin(); it != props->end(); ++it) list.push_back({it.key(), &it.value(), required.count(it.key()) > 0});
    for (const std::string& r : required) {
      bool listed = false;
      for (const Prop& p : list) listed = listed || p.name == r;
      if (listed) continue;
      if (!additional_allowed) unsupported(path + ".required", fmt::format("'{}' is required but additionalProperties is false", r));
      list.push_back({r, additional, true});
    }
    auto pair = [&](const Prop& p) {
      const std::string ppath = path + ".properties." + p.name;
      return g.seq({lit(compact(Json(p.name))), sep(':'), p.schema ? value(*p.schema, ppath) : any_value()});
    };
    // rest[i]: properties i.. after at least one was written (each with its comma);
    // first[i]: properties i.. when none was written yet.
    const size_t n = list.size();
    std::vector<int32_t> rest(n + 1), first(n + 1);
    rest[n] = first[n] = g.empty();
    for (size_t i = n; i-- > 0;) {
      const int32_t with_comma = g.seq({sep(','), pair(list[i])});
      rest[i] = g.seq({list[i].required ? with_comma : g.optional(with_comma), rest[i + 1]});
      const int32_t here = g.seq({pair(list[i]), rest[i + 1]});
      first[i] = list[i].required ? here : g.alt({here, first[i + 1]});
    }
    return g.seq({lit("{"), first[0], lit("}")});
  }

  const Json& resolve_ref(const Json& s, const std::string& path) {
    const Json& r = s["$ref"];
    if (!r.is_string()) unsupported(path + ".$ref", "must be a string");
    const std::string ref = r.get<std::string>();
    if (ref == "#") return root;
    if (ref.rfind("#/", 0) != 0) unsupported(path + ".$ref", fmt::format("only local references (#/...) are supported, got '{}'", ref));
    try {
      const Json::json_pointer ptr(ref.substr(1));
      if (!root.contains(ptr)) unsupported(path + ".$ref", fmt::format("'{}' points to nothing", ref));
      return root.at(ptr);
    } catch (const Json::exception&) {
      unsupported(path + ".$ref", fmt::format("'{}' is not a valid JSON pointer", ref));
    }
  }

  int32_t ref_value(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items())
      if (k != "$ref" && !kAnnotations.count(k)) unsupported(path + "." + k, "keywords beside $ref are not supported");
    const Json& target = resolve_ref(s, path);
    if (std::find(ref_stack.begin(), ref_stack.end(), &target) != ref_stack.end()) {
      auto it = ref_rules.find(&target);
      if (it == ref_rules.end()) it = ref_rules.emplace(&target, g.add_rule(s["$ref"].get<std::string>())).first;
      return g.ref(it->second);
    }
    if (ref_stack.size() >= kMaxRefDepth) unsupported(path + ".$ref", "references nest too deeply");
    ref_stack.push_back(&target);
    const int32_t body = value(target, s["$ref"].get<std::string>());
    ref_stack.pop_back();
    auto it = ref_rules.find(&target);
    if (it == ref_rules.end()) return body;  // not recursive: inline
    g.set_body(it->second, body);
    const int32_t rule = it->second;
    ref_rules.erase(it);  // a later, separate use inlines again or makes its own rule
    return g.ref(rule);
  }

  // allOf: the schemas merged keyword by keyword (properties and required united).
  Json merge_all_of(const Json& s, const std::string& path) {
    Json merged = s;
    merged.erase("allOf");
    const Json& all = s["allOf"];
    if (!all.is_array() || all.empty()) unsupported(path + ".allOf", "must be a non-empty array");
    // additionalProperties sees only its own schema's properties: merged, it would see the
    // siblings' too and allow what the schema forbids.
    {
      std::vector<Json> parts = {merged};
      for (size_t i = 0; i < all.size(); ++i) {
        const Json& p = all[i].is_object() && all[i].contains("$ref") ? resolve_ref(all[i], path) : all[i];
        parts.push_back(p);
      }
      std::set<std::string> names;
      for (const Json& p : parts)
        if (p.is_object() && p.contains("properties") && p["properties"].is_object())
          for (auto it = p["properties"].begin(); it != p["properties"].end(); ++it) names.insert(it.key());
      for (const Json& p : parts) {
        if (!p.is_object() || !p.contains("additionalProperties") || p["additionalProperties"] == Json(true)) continue;
        for (const std::string& n : names)
          if (!p.contains("properties") || !p["properties"].contains(n))
            unsupported(path + ".allOf", fmt::format("additionalProperties of one member would refuse property '{}' "
                                                     "of another; such an allOf is not enforced",
                                                     n));
      }
    }
    for (size_t i = 0; i < all.size(); ++i) {
      Json part = all[i];
      const std::string ppath = fmt::format("{}.allOf[{}]", path, i);
      if (part.is_object() && part.contains("$ref")) part = resolve_ref(part, ppath);
      if (!part.is_object()) unsupported(ppath, "must be a schema object");
      if (part.contains("allOf")) part = merge_all_of(part, ppath);
      for (auto it = part.begin(); it != part.end(); ++it) {
        const std::string& k = it.key();
        if (kAnnotations.count(k)) continue;
        if (!merged.contains(k)) {
          merged[k] = it.value();
        } else if (k == "properties") {
          for (auto p = it->begin(); p != it->end(); ++p) {
            if (merged[k].contains(p.key()) && merged[k][p.key()] != p.value())
              merged[k][p.key()] = Json{{"allOf", Json::array({merged[k][p.key()], p.value()})}};
            else
              merged[k][p.key()] = p.value();
          }
        } else if (k == "required") {
          for (const Json& r : *it)
            if (std::find(merged[k].begin(), merged[k].end(), r) == merged[k].end()) merged[k].push_back(r);
        } else if (merged[k] != it.value()) {
          unsupported(ppath + "." + k, "conflicts with another allOf member (only compatible allOf are merged)");
        }
      }
    }
    return merged;
  }

  std::set<std::string> types_of(const Json& s, const std::string& path) {
    if (s.is_boolean()) return s.get<bool>() ? std::set<std::string>{"any"} : std::set<std::string>{};
    if (s.contains("$ref")) return types_of(resolve_ref(s, path), path);
    if (s.contains("const")) return value_types(s["const"]);
    if (s.contains("enum") && s["enum"].is_array()) {
      std::set<std::string> out;
      for (const Json& v : s["enum"]) {
        auto t = value_types(v);
        out.insert(t.begin(), t.end());
      }
      return out;
    }
    if (auto it = s.find("type"); it != s.end()) {
      std::set<std::string> out;
      if (it->is_string()) out.insert(it->get<std::string>());
      else if (it->is_array())
        for (const Json& t : *it) out.insert(t.get<std::string>());
      if (out.count("number")) out.insert("integer");
      return out;
    }
    return {"any"};
  }

  // A required property with a const value (a discriminator), when there is one.
  std::optional<std::pair<std::string, Json>> discriminator(const Json& s, const std::string& path) {
    const Json& t = s.contains("$ref") ? resolve_ref(s, path) : s;
    if (!t.contains("properties") || !t.contains("required")) return std::nullopt;
    for (const Json& r : t["required"]) {
      if (!r.is_string()) continue;
      const std::string name = r.get<std::string>();
      if (!t["properties"].contains(name)) continue;
      const Json& p = t["properties"][name];
      if (p.is_object() && p.contains("const")) return std::pair{name, p["const"]};
      if (p.is_object() && p.contains("enum") && p["enum"].is_array() && p["enum"].size() == 1) return std::pair{name, p["enum"][0]};
    }
    return std::nullopt;
  }

  void check_one_of_disjoint(const Json& options, const std::string& path) {
    for (size_t i = 0; i < options.size(); ++i) {
      for (size_t j = i + 1; j < options.size(); ++j) {
        const std::string pi = fmt::format("{}.oneOf[{}]", path, i), pj = fmt::format("{}.oneOf[{}]", path, j);
        auto a = types_of(options[i], pi), b = types_of(options[j], pj);
        bool overlap = a.count("any") || b.count("any");
        for (const std::string& t : a) overlap = overlap || b.count(t);
        if (!overlap) continue;
        if (a == std::set<std::string>{"object"} && b == a) {
          auto da = discriminator(options[i], pi), db = discriminator(options[j], pj);
          if (da && db && da->first == db->first && da->second != db->second) continue;
        }
        unsupported(path + ".oneOf", fmt::format("alternatives {} and {} may both match a value, which oneOf forbids; "
                                                 "only oneOf with alternatives of different types, or objects with a "
                                                 "distinct const in a shared required property, is enforced (use anyOf)",
                                                 i, j));
      }
    }
  }

  int32_t value(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) unsupported(path, "the schema 'false' matches nothing");
      return any_value();
    }
    if (!s.is_object()) unsupported(path, "a schema must be an object or a boolean");
    if (s.contains("$ref")) return ref_value(s, path);
    if (s.contains("allOf")) return value(merge_all_of(s, path), path);
    for (const char* k : {"not", "if", "then", "else", "multipleOf", "contains", "minContains", "maxContains",
                          "unevaluatedItems", "additionalItems", "dependencies", "$anchor", "$dynamicRef",
                          "contentEncoding", "contentMediaType", "contentSchema"})
      if (s.contains(k)) unsupported(path + "." + k, "is not supported");
    if (auto it = s.find("uniqueItems"); it != s.end() && !(it->is_boolean() && !it->get<bool>()))
      unsupported(path + ".uniqueItems", "is not supported");
    static const std::set<std::string, std::less<>> kKnown = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "nullable", "uniqueItems",
        "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
        "dependentSchemas", "unevaluatedProperties"};
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!kKnown.count(it.key()) && !kAnnotations.count(it.key()))
        unsupported(path + "." + it.key(), "is not a supported JSON Schema keyword");

    int32_t node;
    if (s.contains("const")) {
      node = literal_value(s["const"]);
    } else if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) unsupported(path + ".enum", "must be a non-empty array");
      std::vector<int32_t> options;
      for (const Json& v : e) options.push_back(literal_value(v));
      node = g.alt(std::move(options));
    } else if (s.contains("anyOf") || s.contains("oneOf")) {
      const bool one = s.contains("oneOf");
      const char* key = one ? "oneOf" : "anyOf";
      if (s.contains("anyOf") && s.contains("oneOf")) unsupported(path + ".oneOf", "together with anyOf is not supported");
      const Json& options = s[key];
      if (!options.is_array() || options.empty()) unsupported(path + "." + key, "must be a non-empty array");
      if (one) check_one_of_disjoint(options, path);
      // Sibling keywords apply to every alternative.
      Json base = s;
      base.erase(key);
      std::vector<int32_t> alts;
      for (size_t i = 0; i < options.size(); ++i) {
        const std::string opath = fmt::format("{}.{}[{}]", path, key, i);
        bool has_constraints = false;
        for (auto it = base.begin(); it != base.end(); ++it) has_constraints = has_constraints || !kAnnotations.count(it.key());
        if (has_constraints) {
          alts.push_back(value(Json{{"allOf", Json::array({base, options[i]})}}, opath));
        } else {
          alts.push_back(value(options[i], opath));
        }
      }
      node = g.alt(std::move(alts));
    } else {
      std::vector<std::string> types;
      if (auto it = s.find("type"); it != s.end()) {
        if (it->is_string()) {
          types.push_back(it->get<std::string>());
        } else if (it->is_array() && !it->empty()) {
          for (const Json& t : *it) {
            if (!t.is_string()) unsupported(path + ".type", "must be a type name or a list of them");
            types.push_back(t.get<std::string>());
          }
        } else {
          unsupported(path + ".type", "must be a type name or a list of them");
        }
      } else {
        // Implied by the keywords present, else any value.
        if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) types.push_back("object");
        if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) types.push_back("array");
        if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) types.push_back("string");
        if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) types.push_back("number");
        if (types.empty()) return any_value();
      }
      std::vector<int32_t> alts;
      for (const std::string& t : types) {
        if (t == "string") alts.push_back(string(s, path));
        else if (t == "integer") alts.push_back(integer(s, path));
        else if (t == "number") alts.push_back(number(s, path));
        else if (t == "boolean") alts.push_back(g.alt({lit("true"), lit("false")}));
        else if (t == "null") alts.push_back(lit("null"));
        else if (t == "object") alts.push_back(object(s, path));
        else if (t == "array") alts.push_back(array(s, path));
        else unsupported(path + ".type", fmt::format("unknown type '{}'", t));
      }
      node = g.alt(std::move(alts));
    }
    if (s.value("nullable", false)) node = g.alt({node, lit("null")});
    return node;
  }

  int32_t raw_string(const Json& s, const std::string& path) {
    if (s.is_object() && s.contains("$ref")) return raw_string(resolve_ref(s, path), path);
    if (s.is_object() && s.contains("enum")) {
      std::vector<int32_t> options;
      for (const Json& v : s["enum"])
        if (v.is_string()) options.push_back(raw_literal(v.get<std::string>()));
      return g.alt(std::move(options));
    }
    if (s.is_object() && s.contains("const") && s["const"].is_string()) return raw_literal(s["const"].get<std::string>());
    return string_content(s.is_object() ? s : Json::object(), path, true);
  }
  int32_t raw_literal(const std::string& text) {
    std::vector<int32_t> parts;
    for (uint32_t cp : decode_utf8(text, "enum")) parts.push_back(raw_chars(g, {{cp, cp}}, o.excluded_char));
    return g.seq(std::move(parts));
  }

  void ensure_any_rules() {
    if (any_value_rule >= 0) return;
    any_value_rule = g.add_rule("json_value");
    any_object_rule = g.add_rule("json_object");
    const int32_t array_rule = g.add_rule("json_array");
    const int32_t val = g.ref(any_value_rule);
    const int32_t kv = g.seq({any_string(), sep(':'), g.ref(any_value_rule)});
    g.set_body(any_object_rule, g.seq({lit("{"), g.optional(g.seq({kv, g.star(g.seq({sep(','), g.seq({any_string(), sep(':'), g.ref(any_value_rule)})}))})), lit("}")}));
    g.set_body(array_rule, g.seq({lit("["), g.optional(g.seq({val, g.star(g.seq({sep(','), g.ref(any_value_rule)}))})), lit("]")}));
    g.set_body(any_value_rule, g.alt({g.ref(any_object_rule), g.ref(array_rule), any_string(), number(Json::object(), ""),
                                      lit("true"), lit("false"), lit("null")}));
  }
};

JsonSchemaCompiler::JsonSchemaCompiler(Grammar& g, const Json& root, JsonSchemaOptions options)
    : impl_(std::make_unique<Impl>(g, root, std::move(options))) {}
JsonSchemaCompiler::~JsonSchemaCompiler() = default;
int32_t JsonSchemaCompiler::value(const Json& schema, const std::string& path) { return impl_->value(schema, path); }
int32_t JsonSchemaCompiler::raw_string(const Json& schema, const std::string& path) { return impl_->raw_string(schema, path); }
int32_t JsonSchemaCompiler::any_value() {
  impl_->ensure_any_rules();
  return impl_->g.ref(impl_->any_value_rule);
}
int32_t JsonSchemaCompiler::any_object() {
  impl_->ensure_any_rules();
  return impl_->g.ref(impl_->any_object_rule);
}

int32_t JsonSchemaCompiler::Impl::any_value() {
  ensure_any_rules();
  return g.ref(any_value_rule);
}

Grammar json_schema_grammar(const Json& schema, const JsonSchemaOptions& options) {
  Grammar g;
  const int32_t start = g.add_rule("root");
  JsonSchemaCompiler c(g, schema, options);
  g.set_body(start, c.value(schema, options.what));
  g.set_start(start);
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  const int32_t start = g.add_rule("root");
  const Json empty = Json::object();
  JsonSchemaCompiler c(g, empty, {});
  g.set_body(start, c.any_object());
  g.set_start(start);
  return g;
}

}  // namespace m3::grammar
