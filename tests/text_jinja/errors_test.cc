// Template errors carry the template line and a clear message; raise_exception() messages pass
// through unchanged; rendering is safe from several threads.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "text/jinja/template.h"

namespace m3::jinja {
namespace {

// Parses and renders; returns the error (and fails the test when there is none).
TemplateError render_error(const std::string& source, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  try {
    Template::parse(source, "test.jinja").render(vars);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an error from: " << source;
  return TemplateError("test.jinja", 0, "none", "none");
}

TEST(TemplateErrors, SyntaxErrorNamesLineAndOrigin) {
  TemplateError e = render_error("line 1\nline 2\n{% if x %}\n{{ 1 + }}\n{% endif %}\n");
  EXPECT_EQ(e.line(), 4);
  EXPECT_EQ(e.type(), "TemplateSyntaxError");
  EXPECT_NE(std::string(e.what()).find("test.jinja, line 4"), std::string::npos) << e.what();
}

TEST(TemplateErrors, UnclosedBlockSaysWhatIsMissing) {
  TemplateError e = render_error("{% for m in messages %}\n{{ m }}\n");
  EXPECT_EQ(e.type(), "TemplateSyntaxError");
  EXPECT_NE(e.message().find("'endfor'"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("innermost block that needs to be closed is 'for'"), std::string::npos) << e.message();
}

TEST(TemplateErrors, UnknownFilterIsASyntaxError) {
  TemplateError e = render_error("ok\n{{ x | no_such_filter }}");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.message(), "No filter named 'no_such_filter'.");
}

TEST(TemplateErrors, RenderErrorNamesLineAndPythonType) {
  TemplateError e = render_error("a\nb\n{{ 1 + 'x' }}");
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.type(), "TypeError");
  EXPECT_EQ(e.message(), "unsupported operand type(s) for +: 'int' and 'str'");
}

TEST(TemplateErrors, ErrorInsideMacroPointsIntoTheMacro) {
  TemplateError e = render_error("{% macro m(x) %}\n  {{ x.a.b }}\n{% endmacro %}\n\n{{ m({}) }}");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.type(), "UndefinedError");
  EXPECT_EQ(e.message(), "'dict object' has no attribute 'a'");
}

TEST(TemplateErrors, UndefinedVariableAttribute) {
  TemplateError e = render_error("{{ messages[0].content }}");
  EXPECT_EQ(e.message(), "'messages' is undefined");
}

TEST(TemplateErrors, RaiseExceptionMessagePassesThrough) {
  TemplateError e = render_error("{% if messages[0].role != 'user' %}\n{{ raise_exception('Conversations must start with a user message') }}\n{% endif %}",
                                 {{"messages", {{{"role", "system"}}}}});
  EXPECT_TRUE(e.raised_by_template());
  EXPECT_EQ(e.message(), "Conversations must start with a user message");
  EXPECT_EQ(e.line(), 2);
}

TEST(TemplateErrors, SandboxRefusesMutation) {
  TemplateError e = render_error("{% set l = [] %}{{ l.append(1) }}");
  EXPECT_EQ(e.type(), "SecurityError");
  EXPECT_EQ(e.message(), "access to attribute 'append' of 'list' object is unsafe.");
}

TEST(TemplateErrors, UnsupportedJinjaFilterFailsOnlyWhenUsed) {
  Template t = Template::parse("{% if wrap %}{{ text|wordwrap(10) }}{% else %}{{ text }}{% endif %}", "t");
  EXPECT_EQ(t.render({{"wrap", false}, {"text", "plain"}}), "plain");
  try {
    t.render({{"wrap", true}, {"text", "plain"}});
    FAIL() << "wordwrap should not be supported";
  } catch (const TemplateError& e) {
    EXPECT_NE(e.message().find("'wordwrap' filter is not supported"), std::string::npos) << e.message();
  }
}

TEST(TemplateErrors, RunawayRecursionStops) {
  TemplateError e = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(e.type(), "RecursionError");
}

TEST(TemplateErrors, InvalidUtf8TemplateIsRejected) {
  TemplateError e = render_error(std::string("ok \xff bad"));
  EXPECT_EQ(e.type(), "TemplateSyntaxError");
}

TEST(TemplateRendering, ConcurrentRendersAgree) {
  Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}"
      "{{ loop.index }}:{{ m|upper }} {% endfor %}{{ ns.n }}",
      "t");
  nlohmann::ordered_json vars = {{"messages", {"alpha", "beta", "gamma"}}};
  const std::string expected = "1:ALPHA 2:BETA 3:GAMMA 14";
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) mismatches[k] += t.render(vars) != expected;
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0);
}

}  // namespace
}  // namespace m3::jinja
