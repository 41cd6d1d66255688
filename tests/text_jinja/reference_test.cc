// Every corpus case rendered by m3serve and by Python's jinja2 (configured as transformers
// configures it) must give byte-identical text, or both must fail.
#include <gtest/gtest.h>

#include "tests/text_jinja/corpus.h"
#include "text/chat_template.h"
#include "text/jinja/template.h"

namespace m3::test {
namespace {

struct Outcome {
  bool ok = false;
  std::string text;
  std::string error;
  bool raised = false;  // by the template's raise_exception()
  std::string raised_message;
};

Outcome render_with_m3serve(const Case& c) {
  Outcome outcome;
  try {
    if (c.is_chat) {
      text::ChatTemplate tmpl(c.source, c.name, c.special_tokens);
      outcome.text = tmpl.render(c.input);
    } else {
      outcome.text = jinja::Template::parse(c.source, c.name).render(c.variables);
    }
    outcome.ok = true;
  } catch (const jinja::TemplateError& e) {
    outcome.error = e.what();
    outcome.raised = e.raised_by_template();
    outcome.raised_message = e.message();
  } catch (const std::exception& e) {
    outcome.error = e.what();
  }
  return outcome;
}

class ReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    snippets_ = new std::vector<Case>(load_snippet_cases("tests/text_jinja/snippets"));
    chats_ = new std::vector<Case>(load_chat_cases("tests/text_jinja/chat_cases.json"));
    std::vector<Case> all = *snippets_;
    all.insert(all.end(), chats_->begin(), chats_->end());
    auto results = run_reference(all);
    snippet_results_ = new std::vector<ReferenceResult>(results.begin(), results.begin() + snippets_->size());
    chat_results_ = new std::vector<ReferenceResult>(results.begin() + snippets_->size(), results.end());
  }
  static void TearDownTestSuite() {
    delete snippets_;
    delete chats_;
    delete snippet_results_;
    delete chat_results_;
  }

  // Returns the number of cases that matched.
  static int check_all(const std::vector<Case>& cases, const std::vector<ReferenceResult>& results) {
    int matched = 0;
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const ReferenceResult& expected = results[k];
      Outcome actual = render_with_m3serve(c);
      if (c.expect_error) {
        EXPECT_FALSE(expected.ok) << c.name << ": the corpus says this case fails, but jinja2 rendered it";
      }
      if (expected.ok) {
        if (!actual.ok) {
          ADD_FAILURE() << c.name << ": jinja2 rendered it, m3serve failed: " << actual.error;
        } else if (actual.text != expected.text) {
          ADD_FAILURE() << c.name << ": " << describe_difference(expected.text, actual.text);
        } else {
          ++matched;
        }
        continue;
      }
      if (actual.ok) {
        ADD_FAILURE() << c.name << ": jinja2 failed (" << expected.type << ": " << expected.message
                      << ") but m3serve rendered it";
      } else if (expected.type == "TemplateError" &&
                 (!actual.raised || actual.raised_message != expected.message)) {
        ADD_FAILURE() << c.name << ": jinja2 raised '" << expected.message << "', m3serve failed with "
                      << actual.error;
      } else {
        ++matched;
      }
    }
    return matched;
  }

  static std::vector<Case>* snippets_;
  static std::vector<Case>* chats_;
  static std::vector<ReferenceResult>* snippet_results_;
  static std::vector<ReferenceResult>* chat_results_;
};

std::vector<Case>* ReferenceTest::snippets_ = nullptr;
std::vector<Case>* ReferenceTest::chats_ = nullptr;
std::vector<ReferenceResult>* ReferenceTest::snippet_results_ = nullptr;
std::vector<ReferenceResult>* ReferenceTest::chat_results_ = nullptr;

TEST_F(ReferenceTest, SnippetsRenderLikeJinja2) {
  ASSERT_GT(snippets_->size(), 100u);
  int matched = check_all(*snippets_, *snippet_results_);
  std::printf("snippets: %d of %zu match jinja2\n", matched, snippets_->size());
}

TEST_F(ReferenceTest, ChatTemplatesRenderLikeTransformers) {
  ASSERT_GT(chats_->size(), 100u);
  int matched = check_all(*chats_, *chat_results_);
  int rendered = 0;
  for (const ReferenceResult& r : *chat_results_) rendered += r.ok;
  std::printf("chat cases: %d of %zu match (%d render, the rest fail in both)\n", matched, chats_->size(),
              rendered);
  // The corpus must mostly render: a template that fails everywhere proves little.
  EXPECT_GT(rendered, static_cast<int>(chats_->size() * 3 / 4));
}

}  // namespace
}  // namespace m3::test
