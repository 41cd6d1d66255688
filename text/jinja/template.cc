#include "text/jinja/template.h"

#include <fmt/format.h>

#include "text/jinja/builtins.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/parser.h"
#include "text/jinja/pyjson.h"

namespace m3::jinja {
namespace {

std::string describe_error(const std::string& origin, int line, const std::string& type,
                           const std::string& message) {
  std::string where = line > 0 ? fmt::format("{}, line {}", origin, line) : origin;
  if (type == "TemplateError") return fmt::format("{}: raise_exception: {}", where, message);
  return fmt::format("{}: {}: {}", where, type, message);
}

}  // namespace

TemplateError::TemplateError(const std::string& origin, int line, std::string type, std::string message)
    : m3::Error(describe_error(origin, line, type, message)),
      line_(line),
      type_(std::move(type)),
      message_(std::move(message)) {}

Template Template::parse(std::string_view source, std::string origin) {
  try {
    auto globals = std::make_shared<Scope>();
    add_globals(*globals);
    return Template(parse_template(source), std::move(globals), origin);
  } catch (const RenderError& e) {
    throw TemplateError(origin, e.line, e.type, e.what());
  }
}

std::string Template::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  if (!variables.is_object()) {
    throw TemplateError(origin_, 0, "TypeError", "template variables must be a JSON object");
  }
  VariableRefs refs;
  refs.reserve(variables.size());
  for (auto it = variables.begin(); it != variables.end(); ++it) refs.emplace_back(it.key(), &it.value());
  return render(refs, options);
}

std::string Template::render(const VariableRefs& variables, const RenderOptions& options) const {
  try {
    auto root = std::make_shared<Scope>(globals_);
    for (const auto& [name, value] : variables) root->set(name, from_json(*value));
    Interpreter interpreter(options);
    return interpreter.render(*ast_, root);
  } catch (const RenderError& e) {
    throw TemplateError(origin_, e.line, e.type, e.what());
  }
}

}  // namespace m3::jinja
