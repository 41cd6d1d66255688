// The template corpus checked against Python's jinja2: small snippets (tests/text_jinja/
// snippets/*.txt) and chat templates x conversations x kwargs (tests/text_jinja/chat_cases.json).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/chat_template.h"

namespace m3::test {

struct Case {
  std::string name;
  std::string source;  // the template text
  bool is_chat = false;
  bool expect_error = false;                // a snippet marked "### error": Python must fail too
  nlohmann::ordered_json variables;         // snippets: the template variables
  nlohmann::ordered_json special_tokens;    // chat: tokenizer special tokens
  text::ChatTemplateInput input;            // chat: messages, tools, kwargs, ...
};

struct ReferenceResult {
  bool ok = false;
  std::string text;           // when ok
  std::string type, message;  // the Python exception otherwise
};

// Snippet files: "### case NAME" starts a case; within it a "### vars {json}" line gives its
// variables and "### error" marks a case that must fail; the other lines up to the next
// "### case" are the template.
std::vector<Case> load_snippet_cases(const std::string& dir);
std::vector<Case> load_chat_cases(const std::string& manifest_path);

// Renders every case with tools/render_chat_reference.py in one Python process.
std::vector<ReferenceResult> run_reference(const std::vector<Case>& cases);

// A readable account of where two outputs first differ.
std::string describe_difference(const std::string& expected, const std::string& actual);

}  // namespace m3::test
