// Builds the AST from tokens with jinja2's grammar (operator precedence, tuples without
// parentheses, tests with a bare argument, filter blocks, macro signatures, loop controls).
#pragma once
#include <memory>
#include <string_view>

#include "text/jinja/ast.h"

namespace m3::jinja {

// Throws RenderError("TemplateSyntaxError") with the line of the problem.
std::unique_ptr<TemplateAst> parse_template(std::string_view source);

// jinja2's compile-time check: a filter or test it does not know is a syntax error, except
// inside {% if %} branches and inline if-expressions, where it fails only when reached.
void check_filter_and_test_names(const TemplateAst& ast);

}  // namespace m3::jinja
