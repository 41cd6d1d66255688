#include "server/structured_output_request.h"

#include <vector>

#include "server/api_error.h"
#include "server/json_parse.h"

namespace m3::server {
namespace {

using Spec = grammar::StructuredOutputSpec;
using Kind = Spec::Kind;

// A schema given as an object, or as JSON text (vLLM accepts both for guided_json / json).
Json schema_value(const Json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    try {
      Json parsed = Json::parse(v.get<std::string>());
      if (parsed.is_object() || parsed.is_boolean()) return parsed;
    } catch (const Json::exception&) {
    }
    bad_field(field, "must be a JSON schema (an object, or its JSON text)");
  }
  bad_field(field, "must be a JSON schema object, got {}", json_type_name(v));
}

std::vector<std::string> choices(const Json& v, const std::string& field) {
  if (!v.is_array() || v.empty()) bad_field(field, "must be a non-empty array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_string(v[i], fmt::format("{}[{}]", field, i)));
  return out;
}

const std::string& text(const Json& v, const std::string& field) {
  if (!v.is_string()) bad_field(field, "must be a string, got {}", json_type_name(v));
  if (v.get_ref<const std::string&>().empty()) bad_field(field, "must not be empty");
  return v.get_ref<const std::string&>();
}

Spec from(Kind kind, const Json& v, const std::string& field) {
  Spec s;
  s.kind = kind;
  s.field = field;
  switch (kind) {
    case Kind::kJsonSchema: s.schema = schema_value(v, field); break;
    case Kind::kRegex:
    case Kind::kGrammar: s.text = text(v, field); break;
    case Kind::kChoice: s.choices = choices(v, field); break;
    case Kind::kJsonObject: break;
  }
  return s;
}

void add(std::optional<Spec>& out, Spec s) {
  if (out) {
    throw ApiError(400, fmt::format("'{}' and '{}' both constrain the output; give only one", out->field, s.field),
                   s.field);
  }
  out = std::move(s);
}

void parse_response_format(const Json& body, std::optional<Spec>& out) {
  const Json* format = read_object(body, "response_format");
  if (!format) return;
  auto type = read_string(*format, "type", "response_format.type");
  if (!type) bad_field("response_format.type", "is required");
  if (*type == "text") return;
  if (*type == "json_object") {
    Spec s;
    s.kind = Kind::kJsonObject;
    s.field = "response_format";
    add(out, std::move(s));
    return;
  }
  if (*type != "json_schema") {
    bad_field("response_format.type", "'{}' is not supported (text, json_object, json_schema)", *type);
  }
  const Json* spec = read_object(*format, "json_schema", "response_format.json_schema");
  if (!spec) bad_field("response_format.json_schema", "is required for type 'json_schema'");
  read_string(*spec, "name", "response_format.json_schema.name");
  read_bool(*spec, "strict", "response_format.json_schema.strict");  // always enforced
  auto it = spec->find("schema");
  if (it == spec->end() || it->is_null()) bad_field("response_format.json_schema.schema", "is required");
  add(out, from(Kind::kJsonSchema, *it, "response_format.json_schema.schema"));
}

void parse_structured_outputs(const Json& body, std::optional<Spec>& out) {
  const Json* so = read_object(body, "structured_outputs");
  if (!so) return;
  static constexpr std::pair<const char*, Kind> kKinds[] = {
      {"json", Kind::kJsonSchema}, {"regex", Kind::kRegex}, {"choice", Kind::kChoice}, {"grammar", Kind::kGrammar}};
  for (auto it = so->begin(); it != so->end(); ++it) {
    const std::string& key = it.key();
    const std::string field = "structured_outputs." + key;
    if (it->is_null()) continue;
    bool known = false;
    for (auto [name, kind] : kKinds) {
      if (key != name) continue;
      known = true;
      add(out, from(kind, *it, field));
    }
    if (known) continue;
    if (key == "json_object") {
      if (!it->is_boolean()) bad_field(field, "must be a boolean");
      if (it->get<bool>()) {
        Spec s;
        s.kind = Kind::kJsonObject;
        s.field = field;
        add(out, std::move(s));
      }
    } else if (key == "disable_fallback") {
      if (!it->is_boolean()) bad_field(field, "must be a boolean");  // there is no fallback either way
    } else if (key == "disable_any_whitespace" || key == "disable_additional_properties") {
      // m3serve's JSON never has free whitespace nor unlisted properties: only true is what it does.
      if (!it->is_boolean() || !it->get<bool>())
        bad_field(field, "only true is supported (the generated JSON is compact and has only the listed properties)");
    } else {
      bad_field(field, "is not supported (json, regex, choice, grammar, json_object)");
    }
  }
}

}  // namespace

std::optional<Spec> parse_structured_output(const Json& body) {
  std::optional<Spec> out;
  parse_response_format(body, out);
  parse_structured_outputs(body, out);
  static constexpr std::pair<const char*, Kind> kGuided[] = {{"guided_json", Kind::kJsonSchema},
                                                             {"guided_regex", Kind::kRegex},
                                                             {"guided_choice", Kind::kChoice},
                                                             {"guided_grammar", Kind::kGrammar}};
  for (auto [field, kind] : kGuided) {
    auto it = body.find(field);
    if (it != body.end() && !it->is_null()) add(out, from(kind, *it, field));
  }
  for (const char* field : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    auto it = body.find(field);
    if (it != body.end() && !it->is_null()) bad_field(field, "is not supported (m3serve has one grammar engine)");
  }
  return out;
}

}  // namespace m3::server
