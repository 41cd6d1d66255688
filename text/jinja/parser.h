// Builds the AST from tokens with jinja2's grammar (operator precedence, tuples without
// parentheses, tests with a bare argument, filter blocks, macro signatures, loop controls).
#pragma once
#include <memory>
#include <string_view>

#include "text/jinja/ast.h"

namespace m3::jinja {

// Throws RenderError("TemplateSyntaxError") with the line of the problem.
std::unique_ptr<TemplateAst> parse_template(std::string_view source);

}  // namespace m3::jinja
