// A Jinja template as transformers renders chat templates: parsed once, rendered many times
// (concurrently) with JSON variables. See text/chat_template.h for the chat-specific entry.
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace m3::jinja {

struct TemplateAst;
class Scope;

// A syntax or render error, with the template line it happened on.
class TemplateError : public m3::Error {
 public:
  TemplateError(const std::string& origin, int line, std::string type, std::string message);
  int line() const { return line_; }
  // The Python exception jinja2 would raise: "TemplateSyntaxError", "UndefinedError",
  // "TypeError", ..., or "TemplateError" for the template's own raise_exception().
  const std::string& type() const { return type_; }
  const std::string& message() const { return message_; }  // without origin and line
  bool raised_by_template() const { return type_ == "TemplateError"; }

 private:
  int line_;
  std::string type_, message_;
};

struct RenderOptions {
  std::optional<std::time_t> now;  // what strftime_now() reads; the clock when absent
};

class Template {
 public:
  // `origin` names the template in errors (a file, or "tokenizer_config.json").
  static Template parse(std::string_view source, std::string origin);

  // `variables`: a JSON object; each key becomes a template variable.
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

  // The same without copying: each name and value must outlive the call. A later name
  // overrides an earlier one.
  using VariableRefs = std::vector<std::pair<std::string_view, const nlohmann::ordered_json*>>;
  std::string render(const VariableRefs& variables, const RenderOptions& options = {}) const;

 private:
  Template(std::shared_ptr<const TemplateAst> ast, std::shared_ptr<Scope> globals, std::string origin)
      : ast_(std::move(ast)), globals_(std::move(globals)), origin_(std::move(origin)) {}
  std::shared_ptr<const TemplateAst> ast_;
  std::shared_ptr<Scope> globals_;  // range, namespace, ...: built once, only read while rendering
  std::string origin_;
};

}  // namespace m3::jinja
