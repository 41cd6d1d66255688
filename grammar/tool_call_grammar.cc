#include "grammar/tool_call_grammar.h"

#include <set>

#include <fmt/format.h>

#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"

namespace m3::grammar {
namespace {

using Json = nlohmann::ordered_json;

const Json& follow(const Json& root, const Json& s) {
  const Json* cur = &s;
  for (int i = 0; i < 32 && cur->is_object() && cur->contains("$ref") && (*cur)["$ref"].is_string(); ++i) {
    const std::string ref = (*cur)["$ref"].get<std::string>();
    if (ref == "#") {
      cur = &root;
      continue;
    }
    if (ref.rfind("#/", 0) != 0) break;
    try {
      cur = &root.at(Json::json_pointer(ref.substr(1)));
    } catch (const Json::exception&) {
      break;
    }
  }
  return *cur;
}

// The JSON types a property schema allows, as far as the coercion reads them.
std::set<std::string> allowed_types(const Json& root, const Json& schema) {
  const Json& s = follow(root, schema);
  if (!s.is_object()) return {"any"};
  std::set<std::string> out;
  auto add_value = [&](const Json& v) {
    if (v.is_string()) out.insert("string");
    else if (v.is_null()) out.insert("null");
    else if (v.is_boolean()) out.insert("boolean");
    else if (v.is_number()) out.insert("number");
    else if (v.is_array()) out.insert("array");
    else out.insert("object");
  };
  if (s.contains("const")) add_value(s["const"]);
  else if (s.contains("enum") && s["enum"].is_array())
    for (const Json& v : s["enum"]) add_value(v);
  else if (s.contains("type")) {
    if (s["type"].is_string()) out.insert(s["type"].get<std::string>());
    else if (s["type"].is_array())
      for (const Json& t : s["type"]) out.insert(t.is_string() ? t.get<std::string>() : "any");
  } else if (s.contains("anyOf") || s.contains("oneOf")) {
    for (const Json& b : s.contains("anyOf") ? s["anyOf"] : s["oneOf"]) {
      auto t = allowed_types(root, b);
      out.insert(t.begin(), t.end());
    }
  } else if (s.contains("allOf")) {
    out = {"any"};
  } else {
    out.insert("any");
  }
  if (s.value("nullable", false)) out.insert("null");
  return out;
}

// The schema without its string alternatives (type lists, anyOf / oneOf branches, enum members).
Json without_strings(const Json& root, const Json& schema) {
  Json s = follow(root, schema);
  if (s.contains("type") && s["type"].is_array()) {
    Json types = Json::array();
    for (const Json& t : s["type"])
      if (t != "string") types.push_back(t);
    s["type"] = types;
  } else if (s.contains("enum") && s["enum"].is_array()) {
    Json kept = Json::array();
    for (const Json& v : s["enum"])
      if (!v.is_string()) kept.push_back(v);
    s["enum"] = kept;
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k) || !s[k].is_array()) continue;
    Json kept = Json::array();
    for (const Json& b : s[k])
      if (allowed_types(root, b) != std::set<std::string>{"string"}) kept.push_back(without_strings(root, b));
    s[k] = kept;
  }
  return s;
}

// Whether the parser reads `k` back as a parameter name: an M3 tag name, an M2 quoted attribute.
bool valid_key(const std::string& k, ToolCallMarkup markup) {
  if (k.empty() || k.size() > 128) return false;
  for (char c : k)
    if (c == '<' || c == '>' || c == '\r' || c == '\n' || (markup == ToolCallMarkup::kMiniMaxM2 && c == '"')) return false;
  if (markup == ToolCallMarkup::kMiniMaxM2) return true;
  return k != "invoke" && k != "tool_call" && k[0] != '/' && k[0] != ' ' && k[0] != '\t';
}

// The literal texts of one markup.
struct Markup {
  std::string block_open, block_close, invoke_open, invoke_name_end, invoke_close;
  std::string param_open, param_name_end, param_close;  // M3: the key follows param_open; the closer names it
  bool closer_names_key;
  uint32_t excluded_char;
  const char* name;
};

Markup markup_of(const ToolCallGrammarOptions& o) {
  if (o.markup == ToolCallMarkup::kMiniMaxM2)
    return {"<minimax:tool_call>\n", "</minimax:tool_call>", "<invoke name=\"", "\">\n", "</invoke>\n",
            "<parameter name=\"", "\">", "</parameter>\n", false, '<', "minimax_m2"};
  const std::string& ns = o.namespace_marker;
  return {ns + "<tool_call>\n", ns + "</tool_call>", ns + "<invoke name=\"", "\">", ns + "</invoke>\n",
          ns + "<", ">", ns + "</", true, ']', "minimax_m3"};
}

}  // namespace

Grammar tool_call_grammar(const Json& tools, const std::string& only, const ToolCallGrammarOptions& options) {
  Grammar g;
  const int32_t start = g.add_rule("tool_calls");
  const Markup m = markup_of(options);
  std::vector<int32_t> invokes;
  if (!tools.is_array()) throw GrammarError("tools", "tools: must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const Json& fn = tool.contains("function") ? tool["function"] : tool;
    const std::string base = fmt::format("tools[{}].function", i);
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) throw GrammarError(base + ".name", base + ".name: missing");
    const std::string name = fn["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    if (name.find('"') != std::string::npos || name.find('>') != std::string::npos)
      throw GrammarError(base + ".name", fmt::format("{}.name: '{}' cannot be written in {} markup", base, name, m.name));
    static const Json kEmpty = Json::object();
    const Json& params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : kEmpty;
    JsonSchemaOptions jo;
    jo.what = base + ".parameters";
    jo.excluded_char = m.excluded_char;
    JsonSchemaCompiler compiler(g, params, jo);
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const Json& r : params["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
    std::vector<int32_t> parts = {g.byte_string(m.invoke_open + name + m.invoke_name_end)};
    if (params.contains("properties") && params["properties"].is_object()) {
      for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
        const std::string& key = it.key();
        const std::string ppath = jo.what + ".properties." + key;
        if (!valid_key(key, options.markup)) {
          if (required.count(key))
            throw GrammarError(ppath, fmt::format("{}: the name cannot be written in {} markup", ppath, m.name));
          continue;
        }
        const std::set<std::string> types = allowed_types(params, it.value());
        int32_t value;
        std::set<std::string> non_string = types;
        non_string.erase("string");
        non_string.erase("null");
        if (types.count("string") && non_string.empty()) {
          value = compiler.raw_string(it.value(), ppath);
          if (types.count("null")) value = g.alt({value, g.byte_string("null")});
        } else if (types.count("string")) {
          value = compiler.value(without_strings(params, it.value()), ppath);
        } else {
          value = compiler.value(it.value(), ppath);
        }
        const std::string closer = m.closer_names_key ? m.param_close + key + ">" : m.param_close;
        const int32_t param = g.seq({g.byte_string(m.param_open + key + m.param_name_end), value, g.byte_string(closer)});
        parts.push_back(required.count(key) ? param : g.optional(param));
      }
    }
    parts.push_back(g.byte_string(m.invoke_close));
    invokes.push_back(g.seq(std::move(parts)));
  }
  if (invokes.empty()) throw GrammarError("tool_choice", fmt::format("tool_choice: no tool named '{}'", only));
  const int32_t invoke = g.alt(std::move(invokes));
  g.set_body(start, g.seq({g.byte_string(m.block_open), options.parallel ? g.repeat(invoke, 1, -1) : invoke,
                           g.byte_string(m.block_close)}));
  g.set_start(start);
  return g;
}

}  // namespace m3::grammar
